"""The one way a sequence the scheduler does not own goes into the KV blocks.

Generation's sequences are the scheduler's. Four other users run sequences of their own through
the same runner and block pool: teacher-forced scoring (`LLMEngine.score`), embeddings
(`engine/embedding.py`), the draft model's shadow sequences (`engine/draft.py`) and the
load-time warm-up (`engine/loader.py`). They all go through `Prefill`, so the rule "only the
scheduler and this module touch a sequence's blocks and num_computed_tokens" holds, and a new
kind of per-sequence state (recurrent state, an adapter) has two places to be threaded through.

A step is a list of `ScheduledChunk`s whose slots were reserved first; running it advances each
chunk's sequence by its tokens. `chunked` drives whole prompts through steps of at most a token
budget (several short prompts to a step, a long one over several), freeing each sequence's
blocks as soon as it is done and all of them on the way out, error or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.model_runner import ModelRunner
from edge_infer.engine.scheduler import ScheduledChunk
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import OutOfMemoryBudget

# rows(seq_index, start, end) -> the chunk's row offsets (from start) whose output is wanted
RowsOf = Callable[[int, int, int], list[int]]


@dataclass(frozen=True, slots=True)
class PrefillStep:
    """One step of `Prefill.chunked`: which sequence (by index) each chunk belongs to, where
    its tokens start, and the step's output rows (chunk after chunk, as the runner returns
    them: logits [M, vocab], or hidden states [M, d_model])."""

    chunks: list[ScheduledChunk]
    owners: list[int]
    starts: list[int]
    rows: np.ndarray


class Prefill:
    """Runs sequences outside the scheduler through one model's runner and block pool."""

    def __init__(self, runner: ModelRunner, bm: BlockManager) -> None:
        self.runner, self.bm = runner, bm

    def claim_cached(self, seq: Sequence) -> int:
        """A new seq's cached prefix blocks (its num_computed_tokens is set to what they hold)."""
        return self.bm.allocate(seq)

    def cache_blocks(self, seq: Sequence) -> None:
        """Register seq's full computed blocks in the prefix cache."""
        self.bm.cache_full_blocks(seq)

    def reserve(self, seq: Sequence, n: int) -> bool:
        """Slots for seq's next n tokens; False, changing nothing, when the pool is short."""
        return self.bm.append_slots(seq, n)

    def forward(self, chunks: list[ScheduledChunk], hidden: bool = False) -> np.ndarray:
        """Run chunks whose slots are reserved and advance each sequence past its tokens; the
        rows of their logit indices (logits, or hidden states), chunk after chunk."""
        rows = self.runner.run(chunks, hidden)
        for c in chunks:
            c.seq.num_computed_tokens += c.num_new_tokens
        return rows

    def rollback(self, seq: Sequence, num_tokens: int) -> None:
        """Keep seq's KV for its first num_tokens tokens only (if it has more)."""
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)
        self.bm.truncate(seq, seq.num_computed_tokens)

    def release(self, seq: Sequence) -> None:
        """Give seq's blocks back to the pool (nothing if it holds none)."""
        if seq.block_table:
            self.bm.free(seq)

    def chunked(self, seqs: list[Sequence], budget: int, rows_of: RowsOf, what: str,
                hidden: bool = False) -> Iterator[PrefillStep]:
        """Run every sequence's tokens from num_computed_tokens to the end, in steps of at most
        `budget` tokens, in order; yields each step. OutOfMemoryBudget when the pool cannot hold
        even a step's first chunk (the running requests hold it: `what`, e.g. "score", may be
        retried later)."""
        pending = list(range(len(seqs)))
        try:
            while pending:
                chunks: list[ScheduledChunk] = []
                owners: list[int] = []
                starts: list[int] = []
                used = 0
                for i in pending:
                    seq = seqs[i]
                    start = seq.num_computed_tokens
                    take = min(seq.num_tokens - start, budget - used)
                    if take <= 0:
                        break
                    if not self.reserve(seq, take):
                        if not chunks:
                            raise OutOfMemoryBudget(f"the KV pool is full with running requests; {what} again later")
                        break
                    end = start + take
                    chunks.append(ScheduledChunk(seq, seq.tokens_slice(start, end), rows_of(i, start, end)))
                    owners.append(i)
                    starts.append(start)
                    used += take
                rows = self.forward(chunks, hidden)
                yield PrefillStep(chunks, owners, starts, rows)
                for i in owners:
                    if seqs[i].num_computed_tokens == seqs[i].num_tokens:
                        self.release(seqs[i])
                pending = [i for i in pending if seqs[i].num_computed_tokens < seqs[i].num_tokens]
        finally:
            for s in seqs:
                self.release(s)
