"""Speculative decoding: the Proposer protocol (n-gram lookup in ngram.py, a draft model in
draft.py), per-sequence adaptive k, and the lossless verifier.

Each step a sequence in decode may carry k proposed tokens; the target scores all of them in
the same forward as its last token (k + 1 logit rows), then `verify` accepts a prefix:
- greedy: while the target's argmax equals the proposal (so output is exactly plain greedy),
- sampling: the rule of Leviathan et al. / Chen et al.: accept x with min(1, p(x) / q(x)),
  on rejection draw from normalize(max(0, p - q)); after k acceptances draw a bonus token
  from p. The output distribution is then exactly the target's.
Rejected tokens' KV slots are rolled back by the scheduler (update_from_output).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edge_infer.config import SpecConfig
from edge_infer.engine.sampler import draw
from edge_infer.engine.sequence import Sequence


@dataclass(slots=True)
class SpecState:
    """Per-sequence speculation state: current k, acceptance history and the draft distributions
    of the pending proposals (None for a deterministic proposal)."""

    k: int
    proposed: int = 0
    accepted: int = 0
    steps: int = 0
    idle_steps: int = 0  # steps spent at k = 0 (auto): probe again after a while
    draft_probs: list[np.ndarray | None] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


# proposals of one sequence: its proposed token ids and the draft's distribution for each
# (None when the proposal is deterministic: an n-gram or a greedy draft)
Proposal = tuple[list[int], list[np.ndarray | None]]


class Proposer(Protocol):
    """What proposes speculative tokens: the n-gram lookup (ngram.py) or a draft model (draft.py)."""

    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, Proposal]:
        """Up to k proposals for each (sequence, k), by sequence id (a missing id: none)."""
        ...

    def rollback(self, seq: Sequence) -> None:
        """After verification: forget what was built on seq's rejected proposals."""
        ...

    def release(self, seq: Sequence) -> None:
        """seq is finished: drop its state."""
        ...


@dataclass(slots=True)
class VerifyResult:
    tokens: list[int]  # accepted proposals followed by the correction or bonus token
    num_accepted: int  # proposals accepted (len(tokens) - 1)


# target(row, tokens accepted before this row) -> (argmax, None) for a greedy request, or
# (None, p) with p the target's sampling distribution (penalties depend on accepted tokens);
# `row` is an item of verify's `logits`: a logit vector, or an index the target reads it by.
TargetFn = Callable[[Any, list[int]], "tuple[int | None, np.ndarray | None]"]


def verify(rng: np.random.Generator | None, logits: Seq[Any], proposals: list[int],
           draft_probs: list[np.ndarray | None], target: TargetFn) -> VerifyResult:
    """Accept a prefix of `proposals` given the target's k + 1 logit rows (logits[j] is handed
    to target as it is). draft_probs[j] is the draft's distribution for proposal j, or None
    when the proposal was deterministic (an n-gram or a greedy draft: q is then one-hot)."""
    out: list[int] = []
    for j, x in enumerate(proposals):
        best, p = target(logits[j], out)
        if p is None:  # greedy: accept while the target would have produced the same token
            assert best is not None
            out.append(int(best))
            if best != x:
                return VerifyResult(out, j)
            continue
        assert rng is not None
        q = draft_probs[j] if j < len(draft_probs) else None
        qx = 1.0 if q is None else float(q[x])
        if qx > 0 and rng.random() < min(1.0, float(p[x]) / qx):
            out.append(x)
            continue
        if q is None:
            residual = p.copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        out.append(draw(residual / total if total > 0 else p, rng))
        return VerifyResult(out, j)
    best, p = target(logits[len(proposals)], out)
    if p is None:
        assert best is not None
        out.append(int(best))
    else:
        assert rng is not None
        out.append(draw(p, rng))
    return VerifyResult(out, len(proposals))


def next_k(cfg: SpecConfig, st: SpecState, num_running: int) -> int:
    """k for the next step: fixed, or adaptive from the recent acceptance; speculation backs off
    when the batch is large enough that a step is compute-bound."""
    if cfg.k != "auto":
        k = int(cfg.k)
    else:
        k = st.k
        if k == 0:
            st.idle_steps += 1
            if st.idle_steps >= 16:  # probe again now and then
                st.idle_steps = 0
                k = 1
    if num_running > 16:
        return 0
    if num_running > 8:
        return min(k, 2)
    if num_running > 4:
        return min(k, 4)
    return k


def adapt(cfg: SpecConfig, st: SpecState, proposed: int, accepted: int) -> None:
    st.proposed += proposed
    st.accepted += accepted
    st.steps += 1
    if cfg.k != "auto" or proposed == 0:
        return
    if accepted == proposed:
        st.k = min(cfg.k_max, st.k + 1)
    elif accepted == 0:
        st.k = max(0, st.k - 1)
    elif accepted < proposed // 2:
        st.k = max(1, st.k - 1)


class SpecDecoder:
    """Owns the proposer and the per-sequence state; the engine calls propose() before each
    schedule and finish() after each verification."""

    def __init__(self, cfg: SpecConfig, proposer: Proposer, max_model_len: int) -> None:
        self.cfg, self.proposer, self.max_model_len = cfg, proposer, max_model_len
        self.states: dict[int, SpecState] = {}
        self.proposed = self.accepted = self.verify_steps = self.emitted = 0

    def state(self, seq: Sequence) -> SpecState:
        st = self.states.get(seq.seq_id)
        if st is None:
            st = SpecState(k=self.cfg.start_k)
            self.states[seq.seq_id] = st
        return st

    def propose(self, running: list[Sequence], max_tokens_of: Callable[[Sequence], int]) -> None:
        """Set spec_token_ids (and the draft distributions) of every running sequence in decode."""
        wanted: list[tuple[Sequence, int]] = []
        for seq in running:
            if seq.is_finished or seq.num_computed_tokens != seq.num_tokens - 1:
                continue
            st = self.state(seq)
            room = min(max_tokens_of(seq) - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1
            k = min(next_k(self.cfg, st, len(running)), room)
            if k > 0:
                wanted.append((seq, k))
        got = self.proposer.propose(wanted) if wanted else {}
        for seq, _ in wanted:
            toks, probs = got.get(seq.seq_id, ([], []))
            seq.spec_token_ids = toks
            self.states[seq.seq_id].draft_probs = probs

    def finish(self, seq: Sequence, proposed: int, accepted: int, emitted: int) -> None:
        st = self.state(seq)
        adapt(self.cfg, st, proposed, accepted)
        self.proposed += proposed
        self.accepted += accepted
        self.verify_steps += 1
        self.emitted += emitted
        self.proposer.rollback(seq)

    def release(self, seq: Sequence) -> None:
        self.states.pop(seq.seq_id, None)
        self.proposer.release(seq)

    def metrics(self) -> dict[str, float]:
        return {
            "spec_proposed_tokens": float(self.proposed),
            "spec_accepted_tokens": float(self.accepted),
            "spec_acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "spec_tokens_per_step": self.emitted / self.verify_steps if self.verify_steps else 0.0,
        }
