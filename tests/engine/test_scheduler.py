"""Scheduler: exact step-by-step behaviour on a BlockManager and model-free sequences.

`Sim` plays the engine loop: schedule(), then update_from_output() with one new token for
every scheduled sequence that samples (the default stop check finishes it after max_tokens). It checks the per-step invariants
(budget, max_num_seqs, decodes before prefills, blocks cover the step) on every step.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.scheduler import SampledTokens, Scheduler, SchedulerOutput
from edge_infer.engine.sequence import Sequence, SequenceStatus
from edge_infer.sampling_params import SamplingParams


@dataclass
class Step:
    scheduled: list[tuple[str, int, bool]]  # (request id, tokens, samples)
    preempted: list[str]


class Sim:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 4,
        max_num_seqs: int = 8,
        budget: int = 16,
        chunked: bool = True,
        caching: bool = False,
    ) -> None:
        self.bm = BlockManager(num_blocks, block_size, caching)
        self.sched = Scheduler(self.bm, max_num_seqs, budget, chunked)
        self.seqs: dict[str, Sequence] = {}
        self.steps: list[Step] = []
        self.finished: list[str] = []

    def add(self, rid: str, prompt_len: int, max_tokens: int, priority: int = 0, base: int = 0) -> Sequence:
        seq = Sequence(
            rid,
            [base + i for i in range(prompt_len)],
            SamplingParams(max_tokens=max_tokens),
            priority=priority,
        )
        self.seqs[rid] = seq
        self.sched.add(seq)
        return seq

    def step(self) -> Step:
        s = self.sched
        before = list(s.running)
        out = s.schedule()
        self._check(out, before)
        rec = Step(
            [(c.seq.request_id, c.num_new_tokens, c.samples) for c in out.chunks],
            [q.request_id for q in out.preempted],
        )
        for c in out.chunks:
            assert c.seq.num_computed_tokens + c.num_new_tokens <= c.seq.num_tokens
            assert c.samples == (c.seq.num_computed_tokens + c.num_new_tokens == c.seq.num_tokens)
        sampled = [SampledTokens(c.seq, [1000 + c.seq.num_tokens]) for c in out.chunks if c.samples]
        finished = s.update_from_output(out, sampled)
        for c in out.chunks:  # a sampled sequence is one token ahead of its KV, a prompt chunk further
            gap = c.seq.num_tokens - c.seq.num_computed_tokens
            assert c.seq.is_finished or (gap == 1 if c.samples else gap >= 1)
        for seq in finished:
            assert seq.status is SequenceStatus.FINISHED_LENGTH and not seq.block_table
            assert seq not in s.running
            self.finished.append(seq.request_id)
        self.steps.append(rec)
        return rec

    def unfinished(self) -> bool:
        return bool(self.sched.waiting or self.sched.running)

    def _check(self, out: SchedulerOutput, before: list[Sequence]) -> None:
        s, bm = self.sched, self.bm
        assert out.num_tokens <= s.max_num_batched_tokens
        assert len(s.running) <= s.max_num_seqs
        ids = [x.seq.seq_id for x in out.chunks]
        assert len(ids) == len(set(ids))
        old = [i for i, x in enumerate(out.chunks) if x.seq in before]
        new = [i for i, x in enumerate(out.chunks) if x.seq not in before]
        assert not old or not new or max(old) < min(new), "running sequences go before admissions"
        for x in out.chunks:
            assert x.num_new_tokens > 0 and x.seq in s.running and x.seq.status is SequenceStatus.RUNNING
            assert len(x.seq.block_table) >= bm.blocks_needed(x.seq.num_computed_tokens + x.num_new_tokens)
        for q in out.preempted:
            assert q in s.waiting and q.block_table == [] and q.num_computed_tokens == 0
        held = {b for q in s.running for b in q.block_table}
        assert bm.num_used_blocks == len(held), "every used block belongs to a running sequence"
        assert all(not q.block_table for q in s.waiting)

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not self.unfinished():
                return
            self.step()
        raise AssertionError(f"not finished after {max_steps} steps")


# -- budget, order, chunking -------------------------------------------------------------------
def test_chunked_prefill_splits_into_budget_sized_chunks() -> None:
    sim = Sim(num_blocks=32, budget=16)
    sim.add("a", 50, max_tokens=3)
    got = [sim.step().scheduled for _ in range(6)]
    assert got == [[("a", 16, False)], [("a", 16, False)], [("a", 16, False)], [("a", 2, True)],
                   [("a", 1, True)], [("a", 1, True)]]
    assert sim.finished == ["a"] and not sim.unfinished() and sim.bm.num_used_blocks == 0


def test_decodes_first_and_prefill_takes_the_leftover_budget() -> None:
    sim = Sim(num_blocks=32, budget=16)
    sim.add("a", 4, max_tokens=5)
    assert sim.step().scheduled == [("a", 4, True)]
    sim.add("b", 30, max_tokens=2)
    sim.add("c", 3, max_tokens=2)
    assert sim.step().scheduled == [("a", 1, True), ("b", 15, False)]
    # b's rest is running work now: it goes before c's admission, and c gets what is left
    assert sim.step().scheduled == [("a", 1, True), ("b", 15, True)]
    assert sim.step().scheduled == [("a", 1, True), ("b", 1, True), ("c", 3, True)]
    sim.run()
    assert sim.finished == ["b", "a", "c"]


def test_budget_respected_and_shared_under_load() -> None:
    sim = Sim(num_blocks=64, budget=8, max_num_seqs=8)
    for i in range(6):
        sim.add(f"r{i}", 5 + 3 * i, max_tokens=4)
    sim.run()
    assert all(sum(n for _, n, _ in rec.scheduled) <= 8 for rec in sim.steps)
    assert sum(sum(n for _, n, _ in rec.scheduled) for rec in sim.steps) == sum(
        5 + 3 * i + 3 for i in range(6)
    )
    assert max(sum(n for _, n, _ in rec.scheduled) for rec in sim.steps) == 8


def test_max_num_seqs() -> None:
    sim = Sim(num_blocks=64, budget=64, max_num_seqs=2)
    for i in range(5):
        sim.add(f"r{i}", 3, max_tokens=3)
    first = sim.step()
    assert [r for r, _, _ in first.scheduled] == ["r0", "r1"]
    assert [q.request_id for q in sim.sched.waiting] == ["r2", "r3", "r4"]
    sim.run()
    assert max(len(rec.scheduled) for rec in sim.steps) == 2
    assert sim.finished == ["r0", "r1", "r2", "r3", "r4"]


def test_fcfs_no_starvation() -> None:
    sim = Sim(num_blocks=16, budget=12, max_num_seqs=3)
    lens = [9, 2, 14, 5, 1, 7, 3, 11]
    for i, n in enumerate(lens):
        sim.add(f"r{i}", n, max_tokens=2 + i % 3)
    sim.run()
    assert sorted(sim.finished) == sorted(sim.seqs)
    first = {}
    for k, rec in enumerate(sim.steps):
        for rid, _, _ in rec.scheduled:
            first.setdefault(rid, k)
    starts = [first[f"r{i}"] for i in range(len(lens))]
    assert starts == sorted(starts), "admission follows arrival order"
    assert all(s.num_output_tokens == s.params.max_tokens for s in sim.seqs.values())


def test_without_chunked_prefill_a_prompt_is_never_split() -> None:
    sim = Sim(num_blocks=32, budget=16, chunked=False)
    sim.add("a", 3, max_tokens=4)
    sim.add("b", 16, max_tokens=1)  # does not fit beside a's prefill
    assert sim.step().scheduled == [("a", 3, True)]
    sim.run()
    assert ("b", 16, True) in [x for rec in sim.steps for x in rec.scheduled]
    assert all(n in (1, 3, 16) for rec in sim.steps for _, n, _ in rec.scheduled)


def test_priority_orders_the_waiting_queue() -> None:
    sim = Sim(num_blocks=16)
    for rid, prio in (("a", 0), ("b", 5), ("c", 0), ("d", -1), ("e", 5), ("f", 0)):
        sim.add(rid, 2, max_tokens=1, priority=prio)
    # smaller priority first, arrival order among equals
    assert [q.request_id for q in sim.sched.waiting] == ["d", "a", "c", "f", "b", "e"]


# -- preemption --------------------------------------------------------------------------------
def test_preempts_newest_when_an_older_sequence_needs_a_block() -> None:
    sim = Sim(num_blocks=4, budget=32)
    a = sim.add("a", 8, max_tokens=4)  # 2 full blocks: its first decode token needs a third
    b = sim.add("b", 6, max_tokens=4)  # 2 blocks, room to decode 2 tokens in place
    assert sim.step().scheduled == [("a", 8, True), ("b", 6, True)]
    assert sim.bm.num_free_blocks == 0
    b_blocks = list(b.block_table)
    rec = sim.step()
    assert rec.preempted == ["b"] and rec.scheduled == [("a", 1, True)]
    assert a.block_table[2] in b_blocks  # a got a block b gave back
    assert b.status is SequenceStatus.WAITING and b.num_preemptions == 1 and b.num_computed_tokens == 0
    assert list(sim.sched.waiting) == [b] and sim.sched.num_preemptions == 1
    assert b.output_token_ids == [1006]  # its output so far is kept and will be recomputed
    sim.run()
    assert sim.finished == ["a", "b"]
    assert b.num_output_tokens == 4
    # b came back with its prompt and first output as one prefill (7 tokens)
    assert ("b", 7, True) in [x for rec in sim.steps for x in rec.scheduled]


def test_preempted_sequence_resumes_ahead_of_later_arrivals() -> None:
    sim = Sim(num_blocks=5, budget=64)
    a = sim.add("a", 6, max_tokens=10)
    b = sim.add("b", 6, max_tokens=10)
    assert sim.step().scheduled == [("a", 6, True), ("b", 6, True)]  # 4 blocks used
    c = sim.add("c", 8, max_tokens=1)  # 2 blocks: does not fit in the 1 free block
    assert sim.step().scheduled == [("a", 1, True), ("b", 1, True)]
    assert sim.step().scheduled == [("a", 1, True), ("b", 1, True)]
    rec = sim.step()  # a takes the last free block; b finds none and, being newest, yields
    assert rec.scheduled == [("a", 1, True)] and rec.preempted == ["b"]
    assert list(sim.sched.waiting) == [b, c]
    sim.run()
    assert sim.finished == ["a", "c", "b"]  # c needs one token only
    back = next(k for k in range(4, len(sim.steps)) if sim.steps[k].scheduled[0][0] == "b")
    assert [rid for rid, _, _ in sim.steps[back].scheduled] == ["b", "c"]  # b is admitted first
    assert all(rid == "a" for rec in sim.steps[4:back] for rid, _, _ in rec.scheduled)
    assert (a.num_output_tokens, b.num_output_tokens, c.num_output_tokens) == (10, 10, 1)
    assert b.num_preemptions == 1 and a.num_preemptions == 0 and c.num_preemptions == 0
    resumed = [x for rec in sim.steps for x in rec.scheduled if x[0] == "b"]
    assert ("b", 9, True) in resumed  # prompt 6 + 3 outputs recomputed at once
    assert sim.bm.num_used_blocks == 0


def test_preemption_recompute_hits_the_prefix_cache() -> None:
    sim = Sim(num_blocks=4, budget=32, caching=True)
    sim.add("a", 8, max_tokens=4)
    b = sim.add("b", 6, max_tokens=4, base=100)
    sim.step()
    assert sim.step().preempted == ["b"]
    sim.run()
    assert sim.finished == ["a", "b"]
    assert b.num_cached_tokens == 4  # b's first full block was still cached when it came back
    resumed = [x for rec in sim.steps[2:] for x in rec.scheduled if x[0] == "b"]
    assert resumed[0] == ("b", 3, True)


# -- rollback (speculative tokens) -------------------------------------------------------------
def test_rollback_frees_blocks_past_the_new_end() -> None:
    sim = Sim(num_blocks=8, budget=32, caching=True)
    seq = sim.add("a", 7, max_tokens=20)
    sim.step()  # prefill: 7 computed, 8 tokens
    seq.spec_token_ids = [51, 52, 53, 54, 55]
    out = sim.sched.schedule()
    assert [(c.seq, c.num_new_tokens, c.samples, c.num_proposed) for c in out.chunks] == [(seq, 6, True, 5)]
    assert out.chunks[0].token_ids == [1007, 51, 52, 53, 54, 55]
    assert out.chunks[0].logit_indices == [0, 1, 2, 3, 4, 5]  # every proposal is verified
    assert len(seq.block_table) == 4  # positions 7..12
    last = seq.block_table[3]
    # the verifier accepted 51, 52 and replaced 53 by 99: 3 proposals' slots are rolled back
    finished = sim.sched.update_from_output(out, [SampledTokens(seq, [51, 52, 99], num_proposed=5, num_accepted=2)])
    assert finished == [] and seq.output_token_ids == [1007, 51, 52, 99] and seq.spec_token_ids == []
    assert seq.num_computed_tokens == 10 and len(seq.block_table) == 3
    # only blocks of known tokens may enter the prefix cache, never proposals
    assert all(len(b.token_ids) == 4 for b in sim.bm.blocks if b.token_ids is not None)
    assert len(sim.bm.cached) == 2
    assert sim.bm.blocks[last].ref_count == 0 and last in sim.bm.free_queue
    assert sim.bm.num_used_blocks == 3
    assert sim.step().scheduled == [("a", 1, True)]  # token 99 is computed next
    sim.sched.rollback(seq, 0)  # nothing rejected: nothing changes
    assert seq.num_computed_tokens == 11 and len(seq.block_table) == 3


def test_a_stop_in_the_middle_of_accepted_tokens_ends_the_sequence() -> None:
    sim = Sim(num_blocks=8, budget=32)
    seq = sim.add("a", 5, max_tokens=3)
    sim.step()
    seq.spec_token_ids = [7, 8, 9]
    out = sim.sched.schedule()
    # max_tokens = 3: of the 4 emitted tokens only 2 more fit; the sequence is freed
    finished = sim.sched.update_from_output(out, [SampledTokens(seq, [7, 8, 9, 4], num_proposed=3, num_accepted=3)])
    assert finished == [seq] and seq.output_token_ids == [1005, 7, 8]
    assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.block_table == [] and sim.bm.num_used_blocks == 0
    assert not sim.unfinished()


def test_forked_samples_join_with_the_leaders_blocks() -> None:
    sim = Sim(num_blocks=8, budget=32)
    leader = sim.add("a", 6, max_tokens=4)
    follower = Sequence("a", list(leader.prompt_token_ids), leader.params, index=1)
    leader.followers = [follower]
    out = sim.sched.schedule()
    sampled = [SampledTokens(follower, [3], fork_of=leader), SampledTokens(leader, [2])]
    assert sim.sched.update_from_output(out, sampled) == []
    assert sim.sched.running == [leader, follower] and leader.followers == []
    assert follower.block_table == leader.block_table and follower.num_computed_tokens == 6
    assert follower.output_token_ids == [3] and leader.output_token_ids == [2]
    assert all(sim.bm.blocks[b].ref_count == 2 for b in leader.block_table)


# -- random workloads --------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 8), st.integers(0, 6), st.integers(-1, 1)),
        min_size=1,
        max_size=8,
    ),
    budget=st.integers(1, 24),
    max_num_seqs=st.integers(1, 4),
    spare_blocks=st.integers(0, 6),
    chunked=st.booleans(),
    caching=st.booleans(),
)
def test_random_workloads_all_finish(
    reqs: list[tuple[int, int, int, int]],
    budget: int,
    max_num_seqs: int,
    spare_blocks: int,
    chunked: bool,
    caching: bool,
) -> None:
    """(prompt length, max_tokens, arrival step, priority): whatever the pool and budget, every
    request finishes with all its tokens and every block comes back."""
    bs = 4
    if not chunked:
        budget = max(budget, 38)  # without chunking a whole sequence must fit in one step
    need = max(-(-(p + m) // bs) for p, m, _, _ in reqs)
    sim = Sim(
        num_blocks=need + spare_blocks,
        block_size=bs,
        max_num_seqs=max_num_seqs,
        budget=budget,
        chunked=chunked,
        caching=caching,
    )
    pending = sorted(enumerate(reqs), key=lambda r: r[1][2])
    for step in range(2000):
        while pending and pending[0][1][2] <= step:
            i, (p, m, _, prio) = pending.pop(0)
            sim.add(f"r{i}", p, m, priority=prio, base=i % 2)  # shared prefixes between requests
        if not pending and not sim.unfinished():
            break
        sim.step()
    else:
        raise AssertionError("did not finish")
    assert sorted(sim.finished) == sorted(sim.seqs)
    assert all(s.num_output_tokens == s.params.max_tokens for s in sim.seqs.values())
    assert sim.bm.num_used_blocks == 0


def test_prefill_is_capped_while_sequences_decode() -> None:
    """With the automatic cap, a step that decodes takes at most max(16, decoding) prompt tokens,
    so a long prompt arriving does not stall the running streams; alone it gets the budget."""
    sim = Sim(num_blocks=200, block_size=4, budget=64)
    sim.sched.prefill_chunk_while_decoding = None
    for i in range(3):
        sim.add(f"d{i}", 4, 50)
    sim.step()  # the three short prompts (12 tokens) fit one step
    long = sim.add("long", 100, 4)
    st = sim.step()
    decode = [n for rid, n, _ in st.scheduled if rid != "long"]
    prompt = [n for rid, n, _ in st.scheduled if rid == "long"]
    assert decode == [1, 1, 1] and prompt == [16]
    sim.sched.prefill_chunk_while_decoding = 0  # no cap: the rest of the budget
    st = sim.step()
    assert [n for rid, n, _ in st.scheduled if rid == "long"] == [61]
    assert long.num_computed_tokens == 77
