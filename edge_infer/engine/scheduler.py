"""Continuous batching: which sequences run in the next step and how many tokens each.

Each step: running sequences first (their next decode token, speculative tokens or the rest
of a chunked prompt), then waiting ones (prompts, chunked to the leftover token budget), under
`max_num_batched_tokens` tokens and `max_num_seqs` sequences. When the KV pool cannot hold the
next tokens, the newest running sequence is preempted: its blocks are freed and it goes back to
the front of the queue, to be recomputed later (the prefix cache usually keeps most of it).
Pure Python ints and lists, so it can be tested exactly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens computed this step (prompt chunk, 1 decode token, or 1 + k draft)

    @property
    def samples(self) -> bool:
        """Whether this step ends at the sequence's last known token (so it produces a token)."""
        return self.seq.num_computed_tokens + self.num_new_tokens >= self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # KV block copies to do first

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, prefill_chunk_while_decoding: int | None = 0) -> None:
        """prefill_chunk_while_decoding caps the prompt tokens of a step that also decodes, so
        running streams keep a steady inter-token latency: 0 = no cap (only the token budget),
        None = automatic (as many prompt tokens as there are decoding sequences, at least 16:
        the step's compute at most doubles), N = at most N."""
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.prefill_chunk_while_decoding = prefill_chunk_while_decoding
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # -- queue management ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence: FCFS, except that a smaller `priority` goes first."""
        seq.status = SequenceStatus.WAITING
        # behind every sequence of the same or a smaller priority (a priority-0 request must not
        # go behind a waiting priority-5 one); the scan stops at once when all are equal
        i = len(self.waiting)
        while i > 0 and self.waiting[i - 1].priority > seq.priority:
            i -= 1
        self.waiting.insert(i, seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step --------------------------------------------------------------------------------
    def _prefill_cap(self) -> int:
        cap = self.prefill_chunk_while_decoding
        if cap == 0 or not self.enable_chunked_prefill:
            return self.max_num_batched_tokens
        decoding = sum(1 for s in self.running if s.num_tokens - s.num_computed_tokens == 1)
        if decoding == 0:
            return self.max_num_batched_tokens
        return max(16, decoding) if cap is None else cap

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        prefill_left = self._prefill_cap()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            base = seq.num_tokens - seq.num_computed_tokens
            want = base + len(seq.spec_token_ids)
            n = min(want, budget if base <= 1 else min(budget, prefill_left))
            if n < want and seq.spec_token_ids:  # proposals are optional: drop what does not fit
                seq.spec_token_ids = seq.spec_token_ids[: max(0, n - base)]
                want = base + len(seq.spec_token_ids)
            if n <= 0:
                i += 1
                continue
            if n < want and not self.enable_chunked_prefill:
                break
            ok = True
            while not self.bm.append_slots(seq, n):
                if seq.spec_token_ids:  # first give up the optional proposals
                    seq.spec_token_ids = []
                    n = min(base, budget)
                    continue
                if len(self.running) - 1 > i:  # the newest running sequence gives way
                    self._preempt(self.running[-1], out)
                else:  # nothing newer to free: this one waits its turn
                    self._preempt(seq, out)
                    ok = False
                    break
            if not ok:
                continue  # running[i] now holds the next sequence (if any)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            if base > 1:
                prefill_left -= n
            i += 1
        if not out.preempted:  # like vLLM: admit nothing new in a step that had to preempt
            self._admit(out, min(budget, prefill_left))
        out.copies = self.bm.pending_copies
        self.bm.pending_copies = []
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            fresh = not seq.block_table
            if fresh and not self.bm.can_allocate(seq, 1):
                break
            if fresh:
                self.bm.allocate(seq)
            want = seq.num_tokens - seq.num_computed_tokens
            n = min(want, budget)
            if (n < want and not self.enable_chunked_prefill) or not self.bm.append_slots(seq, n):
                self._release_admission(seq, fresh)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n

    def _release_admission(self, seq: Sequence, fresh: bool) -> None:
        if fresh:
            self.bm.free(seq)
            seq.num_computed_tokens = 0
            seq.num_cached_tokens = 0

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.bm.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    # -- after the step ----------------------------------------------------------------------------
    def finish_step(self, out: SchedulerOutput) -> None:
        """Advance num_computed_tokens of every scheduled sequence and cache its full blocks.
        (Token appends and stop checks are the engine's; rejected speculative tokens are rolled
        back by the engine through `rollback`.)"""
        for s in out.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            self.bm.cache_full_blocks(s.seq)

    def rollback(self, seq: Sequence, num_rejected: int) -> None:
        """Forget the last num_rejected computed tokens (rejected speculative tokens): their KV
        slots will be overwritten; blocks past the new end go back to the pool."""
        seq.num_computed_tokens -= num_rejected
        keep = self.bm.blocks_needed(seq.num_computed_tokens)
        while len(seq.block_table) > max(keep, 0):
            bid = seq.block_table.pop()
            self.bm._decref(bid)
