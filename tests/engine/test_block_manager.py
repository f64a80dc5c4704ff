"""BlockManager: exact block ids, prefix hits, LRU eviction, copy-on-write, fork, and a hypothesis
state machine that also tracks what each KV slot holds (so a wrong hit or a missed copy shows)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.sequence import Sequence
from edge_infer.sampling_params import SamplingParams

BS = 4


def seq_of(tokens: list[int]) -> Sequence:
    return Sequence("r", list(tokens), SamplingParams())


def admit(bm: BlockManager, seq: Sequence) -> int:
    """allocate + reserve the rest of the prompt + 'compute' it + cache its full blocks."""
    hit = bm.allocate(seq)
    assert bm.append_slots(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)
    return hit


def refs(bm: BlockManager) -> list[int]:
    return [b.ref_count for b in bm.blocks]


# -- exact cases -------------------------------------------------------------------------------
def test_block_ids_handed_out_in_order() -> None:
    bm = BlockManager(8, BS)
    a, b = seq_of(list(range(10))), seq_of(list(range(100, 105)))
    assert admit(bm, a) == 0 and a.block_table == [0, 1, 2]
    assert admit(bm, b) == 0 and b.block_table == [3, 4]
    assert bm.num_free_blocks == 3 and bm.num_used_blocks == 5
    assert refs(bm) == [1, 1, 1, 1, 1, 0, 0, 0]
    # decoding: a new block only when the last one is full
    for _ in range(2):  # tokens 10 and 11 fill block 2
        a.output_token_ids.append(7)
        assert bm.append_slots(a, 1)
        a.num_computed_tokens += 1
        assert len(a.block_table) == 3
    a.output_token_ids.append(7)
    assert bm.append_slots(a, 1) and a.block_table == [0, 1, 2, 5]


def test_prefix_hit_reuses_exact_block_ids() -> None:
    bm = BlockManager(8, BS)
    a = seq_of(list(range(10)))
    admit(bm, a)
    assert len(bm.cached) == 2  # two full blocks; the partial third is not cached
    b = seq_of(list(range(8)) + [50, 51, 52])
    assert bm.allocate(b) == 8
    assert b.block_table == [0, 1] and b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert refs(bm)[:3] == [2, 2, 1]
    assert bm.append_slots(b, 3) and b.block_table == [0, 1, 3]
    # a different first block breaks the chain even if later blocks match
    c = seq_of([99, 1, 2, 3, 4, 5, 6, 7, 8])
    assert bm.allocate(c) == 0 and c.block_table == []
    assert bm.prefix_queries == 10 + 11 + 9 and bm.prefix_hits == 8


def test_prefix_hit_leaves_a_token_to_compute() -> None:
    bm = BlockManager(8, BS)
    admit(bm, seq_of(list(range(8))))
    assert len(bm.cached) == 2
    same = seq_of(list(range(8)))  # both blocks cached, but the last token must be computed
    assert bm.allocate(same) == 4 and same.block_table == [0]
    longer = seq_of(list(range(9)))
    assert bm.allocate(longer) == 8 and longer.block_table == [0, 1]
    assert bm.find_cached_prefix(list(range(4))) == [] and bm.find_cached_prefix(list(range(5))) == [0]


def test_eviction_in_lru_order_tail_first() -> None:
    bm = BlockManager(6, BS)
    a = seq_of(list(range(12)) + [0])  # blocks 0, 1, 2 full and cached, 3 partial
    admit(bm, a)
    assert a.block_table == [0, 1, 2, 3] and len(bm.cached) == 3
    bm.free(a)
    # free queue: never-used 4, 5 first, then a's blocks tail first: 3, 2, 1, 0
    assert list(bm.free_queue) == [4, 5, 3, 2, 1, 0]
    assert bm.num_cached_free_blocks == 3
    b = seq_of(list(range(200, 212)))  # no hit: takes 3 blocks from the front of the queue
    admit(bm, b)
    assert b.block_table == [4, 5, 3]
    assert bm.num_cached_free_blocks == 3  # block 3 was partial: nothing evicted yet
    c = seq_of([300, 301, 302, 303, 304])
    admit(bm, c)
    assert c.block_table == [2, 1]  # a's tail goes first ...
    assert bm.blocks[2].token_ids == (300, 301, 302, 303)  # re-cached with c's tokens
    assert bm.blocks[1].block_hash is None and len(bm.cached) == 3 + 1 + 1  # b's 3, c's 1, a's first
    assert bm.find_cached_prefix(list(range(13))) == [0]  # ... its first block survives


def test_cached_free_block_reclaimed_by_hit() -> None:
    bm = BlockManager(4, BS)
    a = seq_of(list(range(9)))
    admit(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_free_blocks == 2
    b = seq_of(list(range(8)) + [42, 43])
    assert bm.can_allocate(b, 2)
    assert bm.allocate(b) == 8 and b.block_table == [0, 1]
    assert refs(bm) == [1, 1, 0, 0] and 0 not in bm.free_queue and 1 not in bm.free_queue
    assert bm.num_free_blocks == 2
    # the never-used block 3 goes before a's freed (and still cached) tail block 2
    assert bm.append_slots(b, 2) and b.block_table == [0, 1, 3] and list(bm.free_queue) == [2]


def test_can_allocate_counts_hits_and_reclaims() -> None:
    bm = BlockManager(3, BS)
    a = seq_of(list(range(9)))  # 3 blocks
    admit(bm, a)
    bm.free(a)
    b = seq_of(list(range(8)) + [7, 7, 7, 7, 7])  # 8 hit + 5 new tokens = 4 blocks > 3
    assert not bm.can_allocate(b, 5)
    assert bm.can_allocate(b, 4)  # 12 tokens: 2 reclaimed + 1 new
    bm2 = BlockManager(2, BS)
    assert not bm2.can_allocate(seq_of(list(range(9))), 9) and bm2.can_allocate(seq_of(list(range(9))), 8)


def test_append_slots_fails_without_changing_anything() -> None:
    bm = BlockManager(2, BS)
    a = seq_of(list(range(5)))
    bm.allocate(a)
    assert not bm.append_slots(a, 9)
    assert a.block_table == [] and bm.num_free_blocks == 2
    assert bm.append_slots(a, 5) and a.block_table == [0, 1]


def test_fork_shares_blocks_and_copy_on_write() -> None:
    bm = BlockManager(8, BS)
    parent = seq_of(list(range(6)))  # block 0 full, block 1 holds 2 tokens
    admit(bm, parent)
    child = seq_of(list(range(6)))
    bm.fork(parent, child)
    assert child.block_table == [0, 1] and child.num_computed_tokens == 6
    assert refs(bm)[:3] == [2, 2, 0]
    # the child appends into the shared partial block: it gets a private copy
    child.output_token_ids.append(60)
    assert bm.append_slots(child, 1)
    assert child.block_table == [0, 2] and bm.take_copies() == [(1, 2)]
    assert refs(bm)[:3] == [2, 1, 1]
    # the parent now owns block 1 alone: no copy
    parent.output_token_ids.append(61)
    assert bm.append_slots(parent, 1)
    assert parent.block_table == [0, 1] and bm.take_copies() == []
    # appending into a full shared block needs no copy either
    bm2 = BlockManager(8, BS)
    p2 = seq_of(list(range(8)))
    admit(bm2, p2)
    c2 = seq_of(list(range(8)))
    bm2.fork(p2, c2)
    c2.output_token_ids.append(1)
    assert bm2.append_slots(c2, 1) and c2.block_table == [0, 1, 2] and bm2.take_copies() == []
    bm.free(parent)
    bm.free(child)
    assert bm.num_used_blocks == 0 and refs(bm) == [0] * 8


def test_copy_on_write_needs_a_free_block() -> None:
    bm = BlockManager(2, BS)
    parent = seq_of(list(range(6)))
    admit(bm, parent)
    child = seq_of(list(range(6)))
    bm.fork(parent, child)
    child.output_token_ids.append(9)
    assert not bm.can_allocate(child, 1)  # the copy would need a third block
    assert not bm.append_slots(child, 1) and bm.take_copies() == [] and child.block_table == [0, 1]


def test_double_free() -> None:
    bm = BlockManager(4, BS)
    a = seq_of(list(range(5)))
    admit(bm, a)
    table = list(a.block_table)
    bm.free(a)
    bm.free(a)  # a's table is empty now: freeing again is a no-op
    assert bm.num_free_blocks == 4
    a.block_table = table  # a stale table released twice is a bug, and asserts
    with pytest.raises(AssertionError, match="double free"):
        bm.free(a)


def test_reset_prefix_cache_forgets_only_free_blocks() -> None:
    bm = BlockManager(8, BS)
    a, b = seq_of(list(range(8)) + [1]), seq_of(list(range(100, 109)))
    admit(bm, a)
    admit(bm, b)
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.find_cached_prefix(list(range(9))) == []
    assert bm.find_cached_prefix(list(range(100, 109))) == b.block_table[:2]


def test_prefix_caching_disabled() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = seq_of(list(range(9)))
    admit(bm, a)
    assert bm.cached == {} and all(blk.block_hash is None for blk in bm.blocks)
    assert bm.allocate(seq_of(list(range(9)))) == 0


# -- the state machine -------------------------------------------------------------------------
DOCS = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9, 9, 9, 9, 5, 5, 5, 5], [7] * 8)


class BlockMachine(RuleBasedStateMachine):
    """Sequences are admitted, reserve and 'compute' slots, decode, fork, get preempted and
    freed. A shadow KV pool (block -> token in each slot) is written the way the model runner
    would (pending copies first), so every computed position must read back its own token.
    Prompts are prefixes of a few documents plus a random tail, so prefix hits are common."""

    @initialize(num_blocks=st.integers(2, 16), caching=st.sampled_from([True, True, False]))
    def setup(self, num_blocks: int, caching: bool) -> None:
        self.bm = BlockManager(num_blocks, BS, caching)
        self.seqs: list[Sequence] = []
        self.pending: dict[int, int] = {}  # seq_id -> reserved, not yet computed tokens
        self.kv: dict[int, list[int | None]] = {b: [None] * BS for b in range(num_blocks)}

    def _drain_copies(self) -> None:
        for src, dst in self.bm.take_copies():
            self.kv[dst] = list(self.kv[src])

    def _pick(self, data: st.DataObject, idle: bool = False) -> Sequence | None:
        pool = [s for s in self.seqs if not idle or not self.pending[s.seq_id]]
        return data.draw(st.sampled_from(pool), label="seq") if pool else None

    def _admit(self, seq: Sequence, data: st.DataObject) -> None:
        hits = self.bm.find_cached_prefix(seq.all_token_ids())
        assert len(hits) * BS < seq.num_tokens  # a hit always leaves a token to compute
        chunk = data.draw(st.integers(1, seq.num_tokens - len(hits) * BS), label="chunk")
        predicted = self.bm.can_allocate(seq, chunk)
        free_before = self.bm.num_free_blocks
        assert self.bm.allocate(seq) == len(hits) * BS and seq.block_table == hits
        ok = self.bm.append_slots(seq, chunk)
        assert ok == predicted, "can_allocate must predict admission exactly"
        if not ok:
            self.bm.free(seq)
            assert self.bm.num_free_blocks == free_before
            return
        self._drain_copies()
        self.seqs.append(seq)
        self.pending[seq.seq_id] = chunk

    def _compute(self, seq: Sequence) -> None:
        n = self.pending[seq.seq_id]
        for j in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
            self.kv[seq.block_table[j // BS]][j % BS] = seq.token_at(j)
        seq.num_computed_tokens += n
        self.pending[seq.seq_id] = 0
        self.bm.cache_full_blocks(seq)

    def _reserve(self, seq: Sequence, n: int) -> bool:
        before = (list(seq.block_table), self.bm.num_free_blocks)
        if not self.bm.append_slots(seq, n):
            assert (list(seq.block_table), self.bm.num_free_blocks) == before and not self.bm.take_copies()
            return False
        self.pending[seq.seq_id] = n
        assert len(seq.block_table) == self.bm.blocks_needed(seq.num_computed_tokens + n)
        self._drain_copies()
        return True

    # -- rules ---------------------------------------------------------------------------------
    @rule(
        doc=st.sampled_from(DOCS),
        length=st.integers(0, 12),
        tail=st.lists(st.integers(0, 2), max_size=5),
        data=st.data(),
    )
    def admit(self, doc: list[int], length: int, tail: list[int], data: st.DataObject) -> None:
        prompt = doc[:length] + tail
        if prompt:
            self._admit(seq_of(prompt), data)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), token=st.integers(0, 2))
    def step(self, data: st.DataObject, token: int) -> None:
        """What one engine step does to a sequence: reserve, compute, maybe sample a token."""
        seq = self._pick(data)
        assert seq is not None
        if self.pending[seq.seq_id]:
            self._compute(seq)
            return
        if seq.num_computed_tokens == seq.num_tokens:
            seq.output_token_ids.append(token)
        n = data.draw(st.integers(1, seq.num_tokens - seq.num_computed_tokens), label="n")
        if self._reserve(seq, n):
            self._compute(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def reserve_only(self, data: st.DataObject) -> None:
        """Reserve without computing, so other sequences' steps interleave with this one's."""
        seq = self._pick(data, idle=True)
        if seq is not None and seq.num_computed_tokens < seq.num_tokens:
            self._reserve(seq, data.draw(st.integers(1, seq.num_tokens - seq.num_computed_tokens), label="n"))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), token=st.integers(0, 2))
    def fork(self, data: st.DataObject, token: int) -> None:
        """n > 1: a sample forked from its parent, then given its own next token."""
        parent = self._pick(data, idle=True)
        if parent is None:
            return
        child = seq_of(parent.prompt_token_ids)
        child.output_token_ids = list(parent.output_token_ids)
        self.bm.fork(parent, child)
        self.seqs.append(child)
        self.pending[child.seq_id] = 0
        if child.num_computed_tokens == child.num_tokens:
            child.output_token_ids.append(token)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = self._pick(data)
        assert seq is not None
        self.seqs.remove(seq)
        del self.pending[seq.seq_id]
        self.bm.free(seq)
        assert seq.block_table == []

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def preempt_and_readmit(self, data: st.DataObject) -> None:
        """Preemption: free everything, recompute prompt + outputs later (often via hits)."""
        seq = self._pick(data)
        assert seq is not None
        self.seqs.remove(seq)
        del self.pending[seq.seq_id]
        self.bm.free(seq)
        seq.reset_for_recompute()
        self._admit(seq, data)

    @rule()
    def reset_cache(self) -> None:
        self.bm.reset_prefix_cache()

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def no_leaks(self) -> None:
        bm = self.bm
        referenced = sum(1 for b in bm.blocks if b.ref_count > 0)
        assert bm.num_free_blocks + referenced == bm.num_blocks
        assert all(bm.blocks[b].ref_count == 0 for b in bm.free_queue)
        assert all(b.block_id in bm.free_queue for b in bm.blocks if b.ref_count == 0)

    @invariant()
    def ref_counts_match_holders(self) -> None:
        holders = [0] * self.bm.num_blocks
        for s in self.seqs:
            assert len(set(s.block_table)) == len(s.block_table), "a block twice in one table"
            for b in s.block_table:
                holders[b] += 1
        assert refs(self.bm) == holders

    @invariant()
    def cache_map_consistent(self) -> None:
        bm = self.bm
        hashed = {b.block_id: b for b in bm.blocks if b.block_hash is not None}
        assert {bid: h for h, bid in bm.cached.items()} == {bid: b.block_hash for bid, b in hashed.items()}
        for b in hashed.values():
            assert b.token_ids is not None and len(b.token_ids) == BS
            assert tuple(self.kv[b.block_id]) == b.token_ids, "a cached block's slots changed"
        if not bm.enable_prefix_caching:
            assert not bm.cached

    @invariant()
    def hash_chains_and_kv_contents(self) -> None:
        bm = self.bm
        for s in self.seqs:
            assert len(s.block_table) >= bm.blocks_needed(s.num_computed_tokens + self.pending[s.seq_id])
            for j in range(s.num_computed_tokens):
                assert self.kv[s.block_table[j // BS]][j % BS] == s.token_at(j), (s.seq_id, j)
            parent, full = None, s.num_computed_tokens // BS
            for i, bid in enumerate(s.block_table):  # a cached block is a full computed one ...
                chunk = tuple(s.tokens_slice(i * BS, (i + 1) * BS))
                h = bm.hash_block(parent, chunk) if i < full else None
                if bm.blocks[bid].block_hash is not None:  # ... whose hash chains from the start
                    assert (bm.blocks[bid].block_hash, bm.blocks[bid].token_ids) == (h, chunk)
                parent = h

    def teardown(self) -> None:
        if hasattr(self, "bm"):
            for s in list(self.seqs):
                self.bm.free(s)
            assert self.bm.num_free_blocks == self.bm.num_blocks


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
