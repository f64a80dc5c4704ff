"""logits -> tokens, per sequence: bias, min_tokens, penalties, temperature, min_p, top_k,
top_p, seeded sampling, and the raw logprobs (vLLM's order and meanings, see SamplingParams).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from edge_infer.engine.sequence import Sequence
from edge_infer.sampling_params import SamplingParams


def log_softmax(x: np.ndarray) -> np.ndarray:
    """float64 log-probabilities of a 1-D logit vector."""
    x = x.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_logprobs(logits: np.ndarray, chosen: int, n: int) -> dict[int, float]:
    """The chosen token's logprob and the n most likely tokens', from raw logits."""
    lp = log_softmax(logits)
    out: dict[int, float] = {}
    if n > 0:
        idx = np.argpartition(-lp, min(n, lp.size - 1))[:n]
        for t in idx[np.argsort(-lp[idx], kind="stable")]:
            out[int(t)] = float(lp[t])
    out[int(chosen)] = float(lp[chosen])
    return out


def apply_penalties(logits: np.ndarray, seq: Sequence, stop_ids: Seq[int]) -> np.ndarray:
    """Logit bias, min_tokens masking and repetition/frequency/presence penalties (a copy)."""
    p = seq.params
    x = logits.astype(np.float32, copy=True)
    if p.logit_bias:
        for tok, b in p.logit_bias.items():
            if 0 <= tok < x.size:
                x[tok] += np.float32(b)
    if seq.num_output_tokens < p.min_tokens:
        for tok in stop_ids:
            if 0 <= tok < x.size:
                x[tok] = -np.inf
    if p.repetition_penalty != 1.0:
        seen = np.unique(np.asarray(seq.all_token_ids(), dtype=np.int64))
        seen = seen[(seen >= 0) & (seen < x.size)]
        v = x[seen]
        x[seen] = np.where(v > 0, v / np.float32(p.repetition_penalty), v * np.float32(p.repetition_penalty))
    if (p.frequency_penalty or p.presence_penalty) and seq.output_token_ids:
        ids, counts = np.unique(np.asarray(seq.output_token_ids, dtype=np.int64), return_counts=True)
        keep = ids < x.size
        ids, counts = ids[keep], counts[keep]
        x[ids] -= np.float32(p.frequency_penalty) * counts.astype(np.float32) + np.float32(p.presence_penalty)
    return x


def changes_logits(seq: Sequence) -> bool:
    """Whether apply_penalties would change anything for seq's next token."""
    p = seq.params
    return bool(p.logit_bias or seq.num_output_tokens < p.min_tokens or p.repetition_penalty != 1.0
                or ((p.frequency_penalty or p.presence_penalty) and seq.output_token_ids))


def sampling_probs(x: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution a non-greedy request samples from: temperature, min_p, top_k, top_p
    applied to penalised logits x; float64 [V] summing to 1."""
    z = x.astype(np.float64) / p.temperature
    z -= z.max()
    probs = np.exp(z)
    probs /= probs.sum()
    if p.min_p > 0.0:
        probs[probs < p.min_p * probs.max()] = 0.0
    if 0 < p.top_k < probs.size:
        kth = np.partition(probs, probs.size - p.top_k)[probs.size - p.top_k]
        probs[probs < kth] = 0.0
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        sorted_p = probs[order]
        cum = np.cumsum(sorted_p)
        total = cum[-1]
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        cut = int(np.searchsorted(cum, p.top_p * total, side="left")) + 1
        probs[order[cut:]] = 0.0
    s = probs.sum()
    return probs / s


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from probs (inverse CDF with a single uniform: reproducible per generator)."""
    cum = np.cumsum(probs)
    u = rng.random() * cum[-1]
    i = int(np.searchsorted(cum, u, side="right"))
    if i >= probs.size or probs[i] <= 0:  # u rounded up to the total: take the last possible token
        i = int(np.flatnonzero(probs > 0)[-1])
    return i


class Sampler:
    """Picks one token per row of logits for the given sequences."""

    def __init__(self, eos_ids: Seq[int]) -> None:
        self.eos_ids = tuple(eos_ids)

    def stop_ids(self, p: SamplingParams) -> tuple[int, ...]:
        ids = () if p.ignore_eos else self.eos_ids
        return ids + (p.stop_token_ids or ())

    def sample_row(self, logits: np.ndarray, seq: Sequence) -> tuple[int, dict[int, float] | None]:
        """(token, logprobs dict or None) for one sequence's next token."""
        p = seq.params
        # the common greedy request needs no copy of the (up to 262k-entry) logits per token
        x = apply_penalties(logits, seq, self.stop_ids(p)) if changes_logits(seq) else logits
        if p.greedy:
            tok = int(np.argmax(x))
        else:
            assert seq.rng is not None
            tok = draw(sampling_probs(x, p), seq.rng)
        lp = top_logprobs(logits, tok, p.logprobs) if p.logprobs is not None else None
        return tok, lp
