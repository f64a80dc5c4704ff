"""One step's logits -> the new tokens of every sequence that samples: a plain sample, the n > 1
samples forked from a finished prompt, or the verification of speculative proposals.

A failure belongs to its sequence: whatever one sequence's sampling raises (its constraints
leave no token, its grammar matcher fails, a processor errs) becomes that sequence's
SampledTokens.error and ends it alone (finish_reason "error"); the other rows are sampled as if
it were not there, so their tokens are the ones they would have had without it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_infer.engine.sampler import greedy_token, process_logits, sample_token, sampling_probs, top_logprobs
from edge_infer.engine.scheduler import SampledTokens, ScheduledChunk
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.spec_decode import SpecDecoder, verify
from edge_infer.errors import GenerationError
from edge_infer.models.step_logits import StepLogits

log = logging.getLogger("edge_infer.engine")


def whole_rows(chunks: list[ScheduledChunk]) -> np.ndarray:
    """bool [M] over the step's logit rows: True where a sequence needs the whole row (sampling,
    logits processors, logprobs), False where its argmax is all it reads (a plain greedy
    sequence, decoding or verifying) or nobody samples from it."""
    out: list[bool] = []
    for c in chunks:
        need = c.samples and not c.seq.is_finished and any(_needs_row(s) for s in (c.seq, *c.seq.followers))
        out.extend([need] * len(c.logit_indices))
    return np.asarray(out, dtype=bool)


def _needs_row(seq: Sequence) -> bool:
    return not seq.params.greedy or bool(seq.logits_processors) or seq.params.logprobs is not None


def sample_step(chunks: list[ScheduledChunk], logits: StepLogits, spec: SpecDecoder | None) -> list[SampledTokens]:
    """logits hold the rows of every chunk's logit_indices, chunk after chunk (whole where
    whole_rows() asked). Followers of an n > 1 request come right before their leader (so
    update_from_output forks them from its blocks first)."""
    out: list[SampledTokens] = []
    row = 0
    for c in chunks:
        first = row
        row += len(c.logit_indices)
        if not c.samples or c.seq.is_finished:
            continue
        seq = c.seq
        if c.num_proposed:
            assert spec is not None
            proposals = c.token_ids[-c.num_proposed :]
            out.append(_guarded(_verify, seq, logits, first, proposals, spec))
            continue
        for f in seq.followers:  # n > 1: every sample starts from the prompt's last logits
            out.append(_guarded(_sample, f, logits, first, seq))
        out.append(_guarded(_sample, seq, logits, first))
    return out


def _guarded(sample: Callable[..., SampledTokens], seq: Sequence, *args: Any) -> SampledTokens:
    """sample(seq, *args), or an empty SampledTokens carrying the error when it raises: the
    scheduler then ends seq alone (a follower that fails is never forked)."""
    try:
        return sample(seq, *args)
    except GenerationError as e:
        reason = str(e)
    except Exception as e:  # a processor's own failure (e.g. llguidance's): this sequence's, not the batch's
        log.warning("request %s sample %d failed: %s: %s", seq.request_id, seq.index, type(e).__name__, e)
        reason = f"generation failed: {type(e).__name__}: {e}"
    return SampledTokens(seq, [], None, error=reason)


def _sample(seq: Sequence, logits: StepLogits, r: int, fork_of: Sequence | None = None) -> SampledTokens:
    if not _needs_row(seq):
        return SampledTokens(seq, [logits.argmax(r)], None, fork_of=fork_of)
    tok, lp = sample_token(logits.row(r), seq)
    return SampledTokens(seq, [tok], None if lp is None else [lp], fork_of=fork_of)


def _verify(seq: Sequence, logits: StepLogits, first: int, proposals: list[int], spec: SpecDecoder) -> SampledTokens:
    """Accept a prefix of seq's proposals given its k + 1 logit rows (first, first + 1, ...)."""
    p = seq.params
    plain = not _needs_row(seq)

    def target(r: int, accepted: list[int]) -> tuple[int | None, np.ndarray | None]:
        if plain:
            return logits.argmax(r), None
        x = process_logits(logits.row(r), seq, accepted)  # penalties see the tokens accepted so far
        return (greedy_token(x), None) if p.greedy else (None, sampling_probs(x, p))

    rows = range(first, first + len(proposals) + 1)
    res = verify(seq.rng, rows, proposals, spec.state(seq).draft_probs, target)
    lps = None
    if p.logprobs is not None:
        lps = [top_logprobs(logits.row(first + r), tok, p.logprobs) for r, tok in enumerate(res.tokens)]
    return SampledTokens(seq, res.tokens, lps, len(proposals), res.num_accepted)
