"""The recurrent-state slots of a hybrid model, as the block manager hands them out (Python ints
and lists only; the backend's state pool holds the floats, one row per slot id).

Slot ids 0..num_seq_slots-1 belong to sequences: one each while it holds blocks. The ids after
them hold snapshots: the state right after a full block of a cached prefix, keyed by that
block's chained hash (block_manager's), so a prefix hit can resume from the state at its end.
A snapshot is taken where a computed block ends every `interval` blocks and at the last full
block of a prompt; snapshots are evicted least recently used first, and dropped with the
cached block their hash names. The last ids are for speculative decoding: a verification step
keeps the state after each of its positions in one, so rejected proposals roll the state back
to the one after the last accepted token. Copies between slots (a fork, a restored snapshot) are queued
and done by the runner before the next forward, as block copies are.

With the disk prefix cache (engine/disk_prefix.py) on, every snapshot let go (dropped with its
block, or its slot taken for a newer one) is recorded (`take_evictions`), for the engine to save
before the next forward can write its slot.
"""

from __future__ import annotations

from collections import OrderedDict


class StateSlots:
    def __init__(self, num_seq_slots: int, num_snapshots: int, interval: int, num_spec: int = 0) -> None:
        """interval: blocks between snapshots (>= 1); num_spec: slots for verification steps."""
        if num_seq_slots < 1 or num_snapshots < 0 or interval < 1 or num_spec < 0:
            raise ValueError(f"state slots: {num_seq_slots} for sequences, {num_snapshots} snapshots every "
                             f"{interval} blocks, {num_spec} for speculation")
        self.num_seq_slots, self.num_snapshots, self.interval = num_seq_slots, num_snapshots, interval
        self.num_spec = num_spec
        self.free = list(range(num_seq_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self.free_snapshots = list(range(num_seq_slots + num_snapshots - 1, num_seq_slots - 1, -1))
        first_spec = num_seq_slots + num_snapshots
        self.free_spec = list(range(first_spec + num_spec - 1, first_spec - 1, -1))
        self.snapshot_of: OrderedDict[int, int] = OrderedDict()  # block hash -> slot, least recent first
        self._copies: list[tuple[int, int]] = []
        self.record_evictions = False  # the disk prefix cache's: (block hash, slot) of snapshots let go
        self._evicted: list[tuple[int, int]] = []

    @property
    def total(self) -> int:
        """Slots the backend's pool must hold."""
        return self.num_seq_slots + self.num_snapshots + self.num_spec

    # -- a sequence's own slot ----------------------------------------------------------------
    def take(self) -> int:
        return self.free.pop()

    def give_back(self, slot: int) -> None:
        # a copy into it not done yet must not land on the slot's next owner
        self._copies = [c for c in self._copies if c[1] != slot]
        self.free.append(slot)

    def copy(self, src: int, dst: int) -> None:
        self._copies.append((src, dst))

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self._copies = self._copies, []
        return copies

    # -- snapshots of cached prefixes ----------------------------------------------------------
    def wanted(self, block_index: int, prompt_blocks: int) -> bool:
        """Whether the state after block `block_index` is worth a snapshot: every interval-th
        block, and the prompt's last full block (prompt_blocks of them)."""
        return self.num_snapshots > 0 and ((block_index + 1) % self.interval == 0 or block_index + 1 == prompt_blocks)

    def reserve_snapshot(self) -> int | None:
        """A slot for a new snapshot: a free one, else the least recently used (unlinked);
        None when every snapshot slot is reserved for one being computed."""
        if self.free_snapshots:
            return self.free_snapshots.pop()
        if self.snapshot_of:
            h, slot = self.snapshot_of.popitem(last=False)
            self._let_go(h, slot)
            return slot
        return None

    def link(self, block_hash: int, slot: int) -> None:
        """The snapshot in `slot` is the state after the block `block_hash` names."""
        if block_hash in self.snapshot_of:  # computed twice (two sequences, or a recomputed prefix)
            self.release_snapshot(slot)
        else:
            self.snapshot_of[block_hash] = slot

    def release_snapshot(self, slot: int) -> None:
        # a queued copy out of it still reads it first: copies run before the forward that could
        # write the slot's next snapshot
        self.free_snapshots.append(slot)

    def drop(self, block_hash: int) -> None:
        """The block `block_hash` names left the prefix cache: its snapshot is of no use."""
        slot = self.snapshot_of.pop(block_hash, None)
        if slot is not None:
            self._let_go(block_hash, slot)
            self.release_snapshot(slot)

    def _let_go(self, block_hash: int, slot: int) -> None:
        if self.record_evictions:
            self._evicted.append((block_hash, slot))

    def take_evictions(self) -> list[tuple[int, int]]:
        """(block hash, slot) of the snapshots let go since the last call (record_evictions on);
        each slot still holds its state until the next forward."""
        out, self._evicted = self._evicted, []
        return out

    def restore(self, block_hash: int, dst: int) -> None:
        """Queue the snapshot after `block_hash` into a sequence's slot (a prefix hit)."""
        self.snapshot_of.move_to_end(block_hash)
        self.copy(self.snapshot_of[block_hash], dst)

    # -- speculative verification ----------------------------------------------------------------
    def reserve_spec(self, k: int) -> list[int]:
        """k slots for a verification step's states (the caller asked no more than are free)."""
        assert k <= len(self.free_spec), "more proposals than verification slots"
        return [self.free_spec.pop() for _ in range(k)]

    def release_spec(self, slots: list[int]) -> None:
        self.free_spec.extend(slots)  # a queued copy out of one still runs before it is written
