"""The block manager's state slots (hybrid models), in Python ints alone: a sequence's slot
taken with its first blocks and given back; a fork's copy, dropped if its target is freed first;
snapshots asked for where a chunk completes every interval-th block and a prompt's last full
block, linked to the block's hash once computed, restored by a prefix hit that stops at the last
snapshot, evicted least recently used first, and dropped with their cached block."""

from __future__ import annotations

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.state_slots import StateSlots
from edge_infer.sampling_params import SamplingParams

BS = 4


def _bm(num_blocks: int = 64, seq_slots: int = 3, snapshots: int = 4, interval: int = 2) -> BlockManager:
    return BlockManager(num_blocks, BS, True, StateSlots(seq_slots, snapshots, interval))


def _seq(tokens: list[int]) -> Sequence:
    return Sequence("r", tokens, SamplingParams(max_tokens=4))


def _compute(bm: BlockManager, seq: Sequence, n: int) -> list[tuple[int, int]]:
    """Schedule and 'run' seq's next n tokens as the scheduler does; the snapshots it asked for."""
    if not seq.block_table:
        bm.allocate(seq)
    assert bm.append_slots(seq, n)
    snaps = bm.snapshots_for(seq, n)
    seq.num_computed_tokens += n
    bm.cache_full_blocks(seq)
    return snaps


def test_slots_follow_their_sequences() -> None:
    bm = _bm(seq_slots=2)
    a, b, c = _seq([1] * 5), _seq([2] * 5), _seq([3] * 5)
    assert bm.append_slots(a, 5) and bm.append_slots(b, 5) and (a.state_slot, b.state_slot) == (0, 1)
    assert not bm.append_slots(c, 5) and c.block_table == [] and c.state_slot == -1  # no slot: nothing changed
    leader, follower = _seq([4] * 5), _seq([4] * 5)
    leader.followers = [follower]
    bm.free(b)
    assert not bm.can_allocate(leader, 5)  # the leader and its sample need two slots
    bm.free(a)
    assert bm.can_allocate(leader, 5)
    bm.allocate(leader)
    assert {leader.state_slot, follower.state_slot} == {0, 1}
    bm.fork(leader, follower)
    bm.free(follower)  # freed before the copy was done: it must not land on the slot's next owner
    assert bm.take_state_copies() == []
    bm.fork(leader, d := _seq([4] * 5))
    assert bm.take_state_copies() == [(leader.state_slot, d.state_slot)]


def test_snapshots_where_blocks_end() -> None:
    bm = _bm(interval=2)
    seq = _seq(list(range(1, 24)))  # 23 tokens: 5 full blocks, the last full one is block 4
    assert _compute(bm, seq, 6) == []  # only block 0 ends in it: not an interval-th block
    assert bm.states is not None
    got = _compute(bm, seq, 10)  # tokens 6..15: block 1 ends at 7 (offset 1), 2 at 11, 3 at 15 (offset 9)
    assert [off for off, _ in got] == [1, 9]
    got = _compute(bm, seq, 7)  # tokens 16..22: block 4 (the prompt's last full one) ends at 19
    assert [off for off, _ in got] == [3]
    assert len(bm.states.snapshot_of) == 3 and not seq.pending_snapshots


def test_hits_resume_from_the_last_snapshot() -> None:
    bm = _bm(interval=2)
    first = _seq(list(range(1, 24)))
    _compute(bm, first, 23)
    snaps = dict(bm.states.snapshot_of) if bm.states else {}
    bm.free(first)
    # the same first 14 tokens: blocks 0..2 are cached, the last snapshot among them ends block 1
    again = _seq(list(range(1, 15)) + [99, 98])
    assert bm.allocate(again) == 2 * BS
    (src, dst), = bm.take_state_copies()
    assert src in snaps.values() and dst == again.state_slot
    assert bm.find_cached_prefix(list(range(1, 24)) + [7]) == bm.find_cached_prefix(list(range(1, 24)) + [8])


def test_snapshots_evicted_least_recent_first_and_dropped_with_their_blocks() -> None:
    bm = _bm(num_blocks=12, snapshots=2, interval=1)
    a = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9])  # blocks 0 and 1: two snapshots
    _compute(bm, a, 9)
    bm.free(a)
    assert bm.states is not None and len(bm.states.snapshot_of) == 2
    b = _seq([50, 51, 52, 53, 54])  # its block 0 takes the least recent slot (a's block 0)
    _compute(bm, b, 5)
    bm.free(b)
    held = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert bm.allocate(held) == 2 * BS  # a's block 1 still has its state
    bm.reset_prefix_cache()  # b's unused cached block goes, and its snapshot with it
    assert list(bm.states.snapshot_of) == [bm.blocks[held.block_table[1]].block_hash]
