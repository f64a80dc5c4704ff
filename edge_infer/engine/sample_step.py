"""One step's logits -> the new tokens of every sequence that samples: a plain sample, the n > 1
samples forked from a finished prompt, or the verification of speculative proposals."""

from __future__ import annotations

import numpy as np

from edge_infer.engine.sampler import process_logits, sample_token, sampling_probs, top_logprobs
from edge_infer.engine.scheduler import SampledTokens, ScheduledChunk
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.spec_decode import SpecDecoder, verify


def sample_step(chunks: list[ScheduledChunk], logits: np.ndarray, spec: SpecDecoder | None) -> list[SampledTokens]:
    """logits float32 [M, V] hold the rows of every chunk's logit_indices, chunk after chunk.
    Followers of an n > 1 request come right before their leader (so update_from_output
    forks them from its blocks first)."""
    out: list[SampledTokens] = []
    row = 0
    for c in chunks:
        rows = logits[row : row + len(c.logit_indices)]
        row += len(c.logit_indices)
        if not c.samples or c.seq.is_finished:
            continue
        seq = c.seq
        if c.num_proposed:
            assert spec is not None
            out.append(_verify(seq, rows, c.token_ids[-c.num_proposed :], spec))
            continue
        for f in seq.followers:  # n > 1: every sample starts from the prompt's last logits
            out.append(_sample(f, rows[0], fork_of=seq))
        out.append(_sample(seq, rows[0]))
    return out


def _sample(seq: Sequence, logits: np.ndarray, fork_of: Sequence | None = None) -> SampledTokens:
    tok, lp = sample_token(logits, seq)
    return SampledTokens(seq, [tok], None if lp is None else [lp], fork_of=fork_of)


def _verify(seq: Sequence, rows: np.ndarray, proposals: list[int], spec: SpecDecoder) -> SampledTokens:
    """Accept a prefix of seq's proposals given its k + 1 logit rows."""
    p = seq.params

    def target(row: np.ndarray, accepted: list[int]) -> tuple[int | None, np.ndarray | None]:
        x = process_logits(row, seq, accepted)  # penalties see the tokens accepted so far
        return (int(x.argmax()), None) if p.greedy else (None, sampling_probs(x, p))

    res = verify(seq.rng, rows, proposals, spec.state(seq).draft_probs, target)
    lps = [top_logprobs(rows[r], tok, p.logprobs) for r, tok in enumerate(res.tokens)] if p.logprobs is not None else None
    return SampledTokens(seq, res.tokens, lps, len(proposals), res.num_accepted)
