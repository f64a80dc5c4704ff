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
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledChunk:
    """The tokens one sequence computes in a step: token_ids start at its num_computed_tokens
    (a prompt chunk, one decode token, or the last token and num_proposed speculative ones);
    logit_indices are the indices within token_ids whose logits are wanted (none for a prompt
    chunk that does not reach the end, the last one for a decode, all k + 1 when verifying)."""

    seq: Sequence
    token_ids: list[int]
    logit_indices: list[int]
    num_proposed: int = 0  # speculative tokens at the end of token_ids
    # hybrid models: (offset in token_ids, snapshot slot) where the state is kept after that token
    snapshots: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def samples(self) -> bool:
        """Whether this chunk produces tokens (it reaches the sequence's last known token)."""
        return bool(self.logit_indices)

    @classmethod
    def of(cls, seq: Sequence, num_new_tokens: int) -> ScheduledChunk:
        """The next num_new_tokens tokens of seq: known tokens first, then its proposals."""
        start = seq.num_computed_tokens
        known = min(num_new_tokens, seq.num_tokens - start)
        spec = num_new_tokens - known
        toks = seq.tokens_slice(start, start + known) + seq.spec_token_ids[:spec]
        if start + known < seq.num_tokens:
            want: list[int] = []
        elif spec:
            want = list(range(known - 1, num_new_tokens))  # verify every proposed token
        else:
            want = [num_new_tokens - 1]
        return cls(seq, toks, want, spec)


@dataclass(slots=True)
class SampledTokens:
    """What the sampler produced for one sequence: its new tokens in order (one, or the accepted
    proposals and a correction or bonus token), their logprobs when asked for, and how many
    proposals the target rejected (their KV slots are rolled back). fork_of: n > 1, a sample
    forked from its leader once the prompt is done (it shares the leader's KV blocks)."""

    seq: Sequence
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None = None
    num_proposed: int = 0
    num_accepted: int = 0
    fork_of: Sequence | None = None
    num_emitted: int = 0  # set by update_from_output: tokens appended before a stop
    error: str | None = None  # sampling failed for this sequence alone: it finishes with this reason

    @property
    def num_rejected(self) -> int:
        return self.num_proposed - self.num_accepted


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # KV block copies to do first
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # recurrent state slot copies (forks)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks)


# stop_check(seq, token just appended) -> None to go on, or (finished status, stop reason)
StopCheck = Callable[[Sequence, int], "tuple[SequenceStatus, str | int | None] | None"]


def length_stop(seq: Sequence, token: int) -> tuple[SequenceStatus, str | int | None] | None:
    """The plain stop rule: after params.max_tokens tokens (the engine's output processor adds
    stop tokens, stop strings and the context limit)."""
    limit = seq.params.max_tokens
    return (SequenceStatus.FINISHED_LENGTH, None) if limit is not None and seq.num_output_tokens >= limit else None


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, prefill_chunk_while_decoding: int | None = 0,
                 stop_check: StopCheck = length_stop) -> None:
        """prefill_chunk_while_decoding caps the prompt tokens of a step that also decodes, so
        running streams keep a steady inter-token latency: 0 = no cap (only the token budget),
        None = automatic (as many prompt tokens as there are decoding sequences, at least 16:
        the step's compute at most doubles), N = at most N. stop_check decides, after each
        appended token, whether its sequence is finished (the engine passes its output
        processor's)."""
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.prefill_chunk_while_decoding = prefill_chunk_while_decoding
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.images_whole = False  # a chunk never cuts an image (engine/vision.py sets it for gemma3)
        self.stop_check = stop_check

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

    def shift_context(self, seq: Sequence, n_keep: int, n_discard: int) -> list[tuple[int, int, int]] | None:
        """A running sequence's context shift (engine/context_shift.py): BlockManager.shift."""
        return self.bm.shift(seq, n_keep, n_discard)

    def remove(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free(seq)

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
            room = self.bm.max_proposals()  # a hybrid verifies as many as it has state slots for
            if room is not None and len(seq.spec_token_ids) > room:
                seq.spec_token_ids = seq.spec_token_ids[:room]
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
            n = self._whole_images(seq, n)
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
            out.chunks.append(self._chunk(seq, n))
            budget -= n
            if base > 1:
                prefill_left -= n
            i += 1
        if not out.preempted:  # like vLLM: admit nothing new in a step that had to preempt
            self._admit(out, min(budget, prefill_left))
        out.copies = self.bm.take_copies()
        out.state_copies = self.bm.take_state_copies()
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
            n = self._whole_images(seq, min(want, budget))
            if (n < want and not self.enable_chunked_prefill) or not self.bm.append_slots(seq, n):
                self._release_admission(seq, fresh)
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.chunks.append(self._chunk(seq, n))
            budget -= n

    def _whole_images(self, seq: Sequence, n: int) -> int:
        """n, or fewer so the chunk stops before an image it would cut (images_whole: gemma3's
        image tokens attend to each other, so an image is computed in one step; one longer
        than the token budget is cut all the same)."""
        if not self.images_whole or not seq.images:
            return n
        start = seq.num_computed_tokens
        for span in seq.images:
            if span.start < start + n < span.start + span.length and span.start > start:
                return span.start - start
        return n

    def _chunk(self, seq: Sequence, n: int) -> ScheduledChunk:
        chunk = ScheduledChunk.of(seq, n)
        chunk.snapshots = self.bm.snapshots_for(seq, n)
        if chunk.num_proposed:  # a hybrid keeps the state after each position it verifies
            first = n - chunk.num_proposed - 1
            chunk.snapshots = sorted(chunk.snapshots + self.bm.spec_snapshots(seq, first, chunk.num_proposed))
        return chunk

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
    def update_from_output(self, scheduled: SchedulerOutput, sampled: list[SampledTokens]) -> list[Sequence]:
        """Apply a step's results; the finished sequences come back (their blocks freed).

        Every chunk's num_computed_tokens advances and its full blocks enter the prefix cache.
        Then each sampled sequence, in order: a forked sample (n > 1) takes its leader's blocks
        and joins the running batch; its tokens are appended until stop_check stops it; the KV
        slots of rejected proposals are rolled back; a finished sequence leaves and is freed."""
        for c in scheduled.chunks:
            c.seq.num_computed_tokens += c.num_new_tokens
            c.seq.spec_token_ids = []
            self.bm.cache_full_blocks(c.seq)
        finished: list[Sequence] = []
        for s in sampled:
            seq = s.seq
            if s.error is not None:  # only this sequence ends (a failed follower is never forked)
                for f in seq.followers:  # samples that will never be forked: their reserved state slots
                    self.bm.free(f)
                seq.status, seq.error, seq.followers = SequenceStatus.FINISHED_ERROR, s.error, []
                self.remove(seq)
                finished.append(seq)
                continue
            if s.fork_of is not None:
                self.bm.fork(s.fork_of, seq)
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
            seq.followers = []  # forked by now (their entries come before the leader's)
            self._append(s)
            if seq.is_finished:
                self.remove(seq)
                finished.append(seq)
            elif s.num_rejected:
                self.rollback(seq, s.num_rejected)
        for c in scheduled.chunks:
            if c.num_proposed:
                self.bm.release_spec(c.seq)
        return finished

    def _append(self, s: SampledTokens) -> None:
        seq = s.seq
        for i, tok in enumerate(s.token_ids):
            seq.output_token_ids.append(tok)
            if s.logprobs is not None:
                seq.output_logprobs.append(s.logprobs[i])
                seq.cumulative_logprob += s.logprobs[i][tok]
            s.num_emitted += 1
            done = self.stop_check(seq, tok)
            if done is not None:
                seq.status, seq.stop_reason = done
                return

    def rollback(self, seq: Sequence, num_rejected: int) -> None:
        """Forget the last num_rejected computed tokens (rejected speculative tokens): their KV
        slots will be overwritten; blocks past the new end go back to the pool."""
        seq.num_computed_tokens -= num_rejected
        self.bm.restore_verified_state(seq, num_rejected)
        self.bm.truncate(seq, seq.num_computed_tokens)
