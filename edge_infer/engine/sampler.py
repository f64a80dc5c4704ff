"""logits -> tokens, per sequence: logits processors built once per request (bias, min_tokens,
penalties), then temperature, min_p, top_k, top_p, seeded sampling, and the raw logprobs
(vLLM's order and meanings, see SamplingParams).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from edge_infer.engine.sequence import LogitsProcessor, Sequence
from edge_infer.errors import GenerationError
from edge_infer.models.step_logits import NON_FINITE_LOGITS
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


def make_logits_processors(p: SamplingParams, stop_ids: Seq[int], vocab_size: int) -> list[LogitsProcessor]:
    """The processors a request's logits go through before sampling, built once per request
    (as mlx-lm's make_logits_processors): logit bias, min_tokens masking of stop_ids, the
    repetition penalty, frequency/presence penalties, in that order. Empty when the request
    needs none, so the common greedy request reads its logits without a copy."""
    procs: list[LogitsProcessor] = []
    if p.logit_bias:
        bias = [(tok, np.float32(b)) for tok, b in p.logit_bias.items() if 0 <= tok < vocab_size]

        def add_bias(prompt: list[int], output: list[int], x: np.ndarray) -> None:
            for tok, b in bias:
                x[tok] += b

        procs.append(add_bias)
    if p.min_tokens > 0:
        masked = [tok for tok in stop_ids if 0 <= tok < vocab_size]

        def hold_stops(prompt: list[int], output: list[int], x: np.ndarray) -> None:
            if len(output) < p.min_tokens:
                x[masked] = -np.inf

        procs.append(hold_stops)
    if p.repetition_penalty != 1.0:
        rp = np.float32(p.repetition_penalty)

        def repetition(prompt: list[int], output: list[int], x: np.ndarray) -> None:
            seen = np.unique(np.asarray(prompt + output, dtype=np.int64))
            seen = seen[(seen >= 0) & (seen < x.size)]
            v = x[seen]
            x[seen] = np.where(v > 0, v / rp, v * rp)

        procs.append(repetition)
    if p.frequency_penalty or p.presence_penalty:
        fp, pp = np.float32(p.frequency_penalty), np.float32(p.presence_penalty)

        def frequency_presence(prompt: list[int], output: list[int], x: np.ndarray) -> None:
            if output:
                ids, counts = np.unique(np.asarray(output, dtype=np.int64), return_counts=True)
                keep = ids < x.size
                x[ids[keep]] -= fp * counts[keep].astype(np.float32) + pp

        procs.append(frequency_presence)
    return procs


def process_logits(logits: np.ndarray, seq: Sequence, extra_output: list[int] | None = None) -> np.ndarray:
    """seq's logits after its processors (a float32 copy; `logits` itself when it has none);
    extra_output: tokens taken as already generated after seq's outputs (speculative ones)."""
    if not seq.logits_processors:
        return logits
    x = logits.astype(np.float32, copy=True)
    output = seq.output_token_ids + extra_output if extra_output else seq.output_token_ids
    for proc in seq.logits_processors:
        proc(seq.prompt_token_ids, output, x)
    return x


def greedy_token(x: np.ndarray) -> int:
    """The argmax of processed logits x, refused when it is not a finite logit (every token
    masked, or NaN logits): GenerationError, which ends only this sequence."""
    tok = int(np.argmax(x))
    if not np.isfinite(x[tok]):
        raise GenerationError(no_token_reason(x))
    return tok


def no_token_reason(x: np.ndarray) -> str:
    """Why processed logits x leave nothing to sample."""
    if np.isnan(x).any() or np.isposinf(x).any():
        return NON_FINITE_LOGITS
    return ("no token can be generated: the request's constraints (min_tokens, stop_token_ids, logit_bias, "
            "the structured-output grammar) exclude every token of the vocabulary")


def sampling_probs(x: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution a non-greedy request samples from: temperature, min_p, top_k, top_p
    applied to penalised logits x; float64 [V] summing to 1 (GenerationError when no logit
    is finite)."""
    z = x.astype(np.float64) / p.temperature
    top = z.max()  # the one pass that also finds a row with no finite logit
    if not np.isfinite(top):
        raise GenerationError(no_token_reason(x))
    z -= top
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


def stop_ids(p: SamplingParams, eos_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The tokens that end a request: the model's end-of-generation ids (unless ignore_eos)
    and the request's stop_token_ids."""
    return (() if p.ignore_eos else eos_ids) + (p.stop_token_ids or ())


def unsatisfiable(p: SamplingParams, eos_ids: tuple[int, ...], vocab_size: int) -> str | None:
    """Why a request could never produce its tokens (a 400 before it runs), or None: min_tokens
    with stop ids that hold back the whole vocabulary, or with a choice constraint whose longest
    choice ends (only the end of generation then allowed) before min_tokens tokens."""
    if p.min_tokens <= 0:
        return None
    held = {t for t in stop_ids(p, eos_ids) if 0 <= t < vocab_size}
    if len(held) >= vocab_size:
        return (f"stop_token_ids cover the whole vocabulary ({vocab_size} tokens) together with the model's "
                f"end-of-generation tokens, so min_tokens ({p.min_tokens}) would leave no token to generate")
    so = p.structured_outputs
    if so is not None and so.choice is not None:
        longest = max(len(c.encode("utf-8")) for c in so.choice)  # a token is at least one byte
        if p.min_tokens > longest:
            return (f"min_tokens ({p.min_tokens}) cannot be honoured with this choice constraint: its longest "
                    f"choice is {longest} bytes, so at most {longest} tokens come before the end")
    return None


def sample_token(logits: np.ndarray, seq: Sequence) -> tuple[int, dict[int, float] | None]:
    """(token, its logprobs or None) for seq's next token from its raw logits [V]."""
    tok = pick_token(process_logits(logits, seq), seq)
    n = seq.params.logprobs
    return tok, (top_logprobs(logits, tok, n) if n is not None else None)


def pick_token(x: np.ndarray, seq: Sequence) -> int:
    """One token from processed logits x: the argmax for a greedy request, else a draw from the
    request's sampling distribution with seq's generator."""
    if seq.params.greedy:
        return greedy_token(x)
    assert seq.rng is not None
    return draw(sampling_probs(x, seq.params), seq.rng)
