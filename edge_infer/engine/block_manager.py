"""Paged KV blocks: allocation, reference counts, automatic prefix caching, copy-on-write.

The interface: can_allocate, allocate, append_slots, truncate, fork, free, cache_full_blocks,
take_copies, reset_prefix_cache and the read-only counters; nothing outside touches the
blocks, the free queue or the cache map. Only Python ints and lists: the model runner turns
block tables into arrays.

State slots (hybrid models; state_slots.py): a recurrent layer keeps one fixed-size state per
sequence, not per token. The manager hands out state slots beside the blocks: a sequence takes
one when it first gets blocks (an admitted request's n > 1 samples reserve theirs with it, so a
fork never waits), gives it back when freed, and a fork queues a state copy as copy-on-write
queues a block copy. A prefix hit must also restore the state at the end of the hit, so it
stops at the last cached block with a state snapshot (`snapshots_for` says which computed
blocks end in one). A verification step keeps the state after each of its positions
(`spec_snapshots`), so rejected proposals roll the state back (`restore_verified_state`).

Prefix caching: a full block is identified by hash((parent block's hash, its token ids)), so
equal hashes mean equal prefixes (the token ids are kept to rule out collisions). A block
whose reference count drops to zero goes to the back of the free queue but stays findable by
its hash until it is handed out again: the free queue is the LRU eviction order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from edge_infer.engine.block_disk import DiskBlocks
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.state_slots import StateSlots


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None  # set with block_hash
    parent_hash: int | None = None  # the previous block's hash (None: the first block)


ROOT_HASH = 0x5EED  # the first block's parent in the hash chain: hash() of None differs per process


class BlockManager(DiskBlocks):
    """num_blocks blocks of block_size token slots; block ids are 0..num_blocks-1."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 states: StateSlots | None = None) -> None:
        """states: a hybrid model's state slots (prefix caching needs its snapshot slots)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.states = states
        self.enable_prefix_caching = enable_prefix_caching and (states is None or states.num_snapshots > 0)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self._pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) for the runner
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found
        # with a disk prefix cache: (block id, hash, parent hash, token ids) of the cached blocks
        # handed out again since take_evictions, for the engine to save before they are overwritten
        self.record_evictions = False
        self._evicted: list[tuple[int, int, int | None, tuple[int, ...]]] = []

    # -- queries -----------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self.free_queue if self.blocks[b].block_hash is not None)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @staticmethod
    def hash_block(parent: int | None, token_ids: tuple[int, ...]) -> int:
        """The same in every process (hash() of ints and tuples of them is not randomized): the
        disk prefix cache names its files by it."""
        return hash((ROOT_HASH if parent is None else parent, token_ids))

    @property
    def num_state_slots(self) -> int:
        """Slots for sequences' recurrent states (0: not a hybrid model)."""
        return self.states.num_seq_slots if self.states is not None else 0

    def find_cached_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest cached run of full blocks that prefixes token_ids, leaving at
        least one token to compute (a step must produce logits); with state slots, the longest
        such run whose last block has a state snapshot."""
        return self._cached_prefix(token_ids)[0]

    def _cached_prefix(self, token_ids: list[int]) -> tuple[list[int], int | None]:
        """(find_cached_prefix's blocks, the hash of the last one)."""
        if not self.enable_prefix_caching:
            return [], None
        found: list[int] = []
        parent: int | None = None
        usable, usable_hash = 0, None  # with states: the run up to the last snapshot
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, chunk)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != chunk:
                break
            found.append(bid)
            parent = h
            if self.states is None or h in self.states.snapshot_of:
                usable, usable_hash = len(found), h
        return found[:usable], usable_hash

    # -- allocation ----------------------------------------------------------------------------
    def _slots_wanted(self, seq: Sequence) -> int:
        """State slots seq and its unforked samples still need (0 without state slots)."""
        if self.states is None:
            return 0
        return sum(1 for s in (seq, *seq.followers) if s.state_slot < 0)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether append_slots(seq, num_new_tokens) would succeed (admission: counts prefix hits
        and the state slots of seq and its n > 1 samples)."""
        if self.states is not None and self._slots_wanted(seq) > len(self.states.free):
            return False
        if not seq.block_table:
            hits = self.find_cached_prefix(seq.cache_key_ids())
            reclaim = sum(1 for b in hits if self.blocks[b].ref_count == 0)
            total = max(len(hits) * self.block_size, seq.num_computed_tokens) + num_new_tokens
            return self.blocks_needed(total) - len(hits) + reclaim <= self.num_free_blocks
        return self._extra_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> int:
        """Admit a new sequence: claim its cached prefix blocks; returns the tokens they cover
        (which become seq.num_computed_tokens)."""
        assert not seq.block_table, "allocate() is for sequences without blocks"
        if self.states is not None:
            for s in (seq, *seq.followers):
                if s.state_slot < 0:
                    s.state_slot = self.states.take()
        tokens = seq.cache_key_ids()
        hits, last_hash = self._cached_prefix(tokens)
        if hits and self.states is not None and last_hash is not None:
            self.states.restore(last_hash, seq.state_slot)
        for bid in hits:
            self._incref(bid)
        seq.block_table = list(hits)
        n = len(hits) * self.block_size
        self.prefix_queries += len(seq.prompt_token_ids)
        self.prefix_hits += min(n, len(seq.prompt_token_ids))
        seq.num_computed_tokens = n
        seq.num_cached_tokens = n
        return n

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for seq's next num_new_tokens tokens (copy-on-write of a shared last block).
        False, changing nothing, if there are not enough free blocks (or no state slot for a
        sequence that has none yet)."""
        if self._extra_blocks(seq, num_new_tokens) > self.num_free_blocks:
            return False
        if self.states is not None and seq.state_slot < 0:
            if not self.states.free:
                return False
            seq.state_slot = self.states.take()
        bs = self.block_size
        start = seq.num_computed_tokens
        if start % bs and seq.block_table:
            last = seq.block_table[start // bs]
            if self.blocks[last].ref_count > 1:  # shared partial block: write into a private copy
                new = self._pop_free()
                self._pending_copies.append((last, new))
                self._decref(last)
                seq.block_table[start // bs] = new
        while len(seq.block_table) < self.blocks_needed(start + num_new_tokens):
            seq.block_table.append(self._pop_free())
        return True

    def _extra_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        start = seq.num_computed_tokens
        need = max(0, self.blocks_needed(start + num_new_tokens) - len(seq.block_table))
        if start % self.block_size and seq.block_table and self.blocks[seq.block_table[start // self.block_size]].ref_count > 1:
            need += 1
        return need

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares all of parent's blocks (n > 1 samples of one prompt) and gets a copy of
        its state (in the slot reserved at the parent's admission)."""
        if self.states is not None:
            if child.state_slot < 0:
                assert self.states.free, "a fork without a reserved state slot"
                child.state_slot = self.states.take()
            self.states.copy(parent.state_slot, child.state_slot)
        for bid in parent.block_table:
            self._incref(bid)
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks that hold seq's first num_tokens tokens; the rest go back to the
        pool (rejected speculative tokens, a draft rolled back to what the target accepted)."""
        if self.states is not None and num_tokens < seq.num_computed_tokens and not seq.spec_slots:
            raise RuntimeError("a recurrent state rolls back only to a verified position (restore_verified_state)")
        keep = self.blocks_needed(max(num_tokens, 0))
        while len(seq.block_table) > keep:
            self._decref(seq.block_table.pop())

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies that copy-on-write asked for since the last call; the KV
        pool must do them before the next forward writes into dst."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    def take_state_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) state-slot copies forks and prefix hits asked for since the last call;
        done before the next forward, like take_copies'."""
        return self.states.take_copies() if self.states is not None else []

    def max_proposals(self) -> int | None:
        """How many speculative tokens the state slots can still verify this step (None: no
        limit, not a hybrid model)."""
        return None if self.states is None else len(self.states.free_spec)

    def spec_snapshots(self, seq: Sequence, first: int, k: int) -> list[tuple[int, int]]:
        """A verification chunk of seq whose token at offset `first` is its last known one and
        the k after it proposals: (offset, slot) keeping the state after offsets first ..
        first + k - 1 (the state after all of them is the sequence's own)."""
        if self.states is None or not k:
            return []
        seq.spec_slots = self.states.reserve_spec(k)
        return [(first + j, slot) for j, slot in enumerate(seq.spec_slots)]

    def restore_verified_state(self, seq: Sequence, num_rejected: int) -> None:
        """seq's last num_rejected proposals were rejected: queue the state after the last
        accepted position into its slot."""
        if self.states is not None and num_rejected:
            self.states.copy(seq.spec_slots[len(seq.spec_slots) - num_rejected], seq.state_slot)

    def release_spec(self, seq: Sequence) -> None:
        """The verification step is settled: its state slots go back."""
        if self.states is not None and seq.spec_slots:
            self.states.release_spec(seq.spec_slots)
            seq.spec_slots = []

    def snapshots_for(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """(offset in the chunk, snapshot slot) for each block seq's next num_new_tokens tokens
        complete that is worth a state snapshot (StateSlots.wanted); the kernels copy the state
        there after that token, and cache_full_blocks links it to the block's hash."""
        st = self.states
        if st is None or not self.enable_prefix_caching:
            return []
        bs, start = self.block_size, seq.num_computed_tokens
        prompt_blocks = len(seq.prompt_token_ids) // bs
        stop = min(start + num_new_tokens, seq.num_tokens)  # never after a proposal: it may be rejected
        out = []
        for end in range((start // bs + 1) * bs, stop + 1, bs):  # block ends in the chunk
            i = end // bs - 1
            if st.wanted(i, prompt_blocks) and i not in seq.pending_snapshots:
                slot = st.reserve_snapshot()
                if slot is None:
                    break
                seq.pending_snapshots[i] = slot
                out.append((end - 1 - start, slot))
        return out

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks; the tail first, so prefix blocks stay cached the longest."""
        for bid in reversed(seq.block_table):
            self._decref(bid)
        seq.block_table = []
        if self.states is not None:
            if seq.state_slot >= 0:
                self.states.give_back(seq.state_slot)
                seq.state_slot = -1
            for slot in seq.pending_snapshots.values():  # never computed: nothing to keep
                self.states.release_snapshot(slot)
            seq.pending_snapshots.clear()
            self.release_spec(seq)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that are now full of computed tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent: int | None = None
        # computed slots past num_tokens hold speculative proposals: never cache those; nor
        # blocks holding shifted K/V (a context shift): they are not what computing them gives
        full = min(min(seq.num_computed_tokens, seq.num_tokens) // bs, len(seq.block_table))
        for i in range(full if seq.no_cache_from is None else min(full, seq.no_cache_from)):
            blk = self.blocks[seq.block_table[i]]
            if blk.block_hash is not None:
                h = blk.block_hash
            else:
                chunk = tuple(seq.cache_key_slice(i * bs, (i + 1) * bs))
                h = self.hash_block(parent, chunk)
                if h not in self.cached:  # a duplicate computed concurrently stays private
                    blk.block_hash, blk.token_ids, blk.parent_hash = h, chunk, parent
                    self.cached[h] = blk.block_id
            slot = seq.pending_snapshots.pop(i, None)
            if slot is not None and self.states is not None:  # the state after this block, computed
                self.states.link(h, slot)
            parent = h

    def shift(self, seq: Sequence, n_keep: int, n_discard: int) -> list[tuple[int, int, int]] | None:
        """A context shift of seq (engine/context_shift.py): its context tokens n_keep ..
        n_keep + n_discard - 1 are dropped and the computed ones after them move n_discard
        positions down, into new blocks from the one holding position n_keep on (the old ones
        are released: another sequence may share them). Returns the K/V row moves (src slot,
        dst slot, position delta: 0 for the kept rows of that first block, -n_discard for the
        moved ones) for the runner to do now, before any block is handed out again; None,
        changing nothing, when the pool has too few free blocks."""
        bs = self.block_size
        first = n_keep // bs
        new_len = seq.num_computed_tokens - n_discard
        fresh = self.blocks_needed(new_len + 1) - first
        if fresh > self.num_free_blocks:
            return None
        old = seq.block_table
        new = old[:first] + [self._pop_free() for _ in range(fresh)]

        def slot(table: list[int], p: int) -> int:
            return table[p // bs] * bs + p % bs

        moves = [(slot(old, p), slot(new, p), 0) for p in range(first * bs, n_keep)]
        moves += [(slot(old, p + n_discard), slot(new, p), -n_discard) for p in range(n_keep, new_len)]
        for bid in reversed(old[first:]):
            self._decref(bid)
        seq.block_table = new
        seq.num_computed_tokens = new_len
        seq.no_cache_from = first if seq.no_cache_from is None else min(first, seq.no_cache_from)
        return moves

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no sequence uses (e.g. after weights change: nothing
        of it is worth saving)."""
        recording, self.record_evictions = self.record_evictions, False
        for bid in self.free_queue:
            self._uncache(self.blocks[bid])
        self.record_evictions = recording

    @property
    def record_evictions(self) -> bool:
        """Whether evicted cached blocks, and a hybrid's state snapshots let go, are recorded
        (the disk prefix cache's take_evictions)."""
        return self._record_evictions

    @record_evictions.setter
    def record_evictions(self, on: bool) -> None:
        self._record_evictions = on
        if self.states is not None:
            self.states.record_evictions = on

    # -- internals -----------------------------------------------------------------------------
    def _pop_free(self) -> int:
        bid, _ = self.free_queue.popitem(last=False)  # least recently freed first
        blk = self.blocks[bid]
        self._uncache(blk)
        blk.ref_count = 1
        return bid

    def _uncache(self, blk: Block) -> None:
        if blk.block_hash is not None:
            if self.cached.get(blk.block_hash) == blk.block_id:
                del self.cached[blk.block_hash]
                if self.record_evictions and blk.token_ids is not None:
                    self._evicted.append((blk.block_id, blk.block_hash, blk.parent_hash, blk.token_ids))
                if self.states is not None:
                    self.states.drop(blk.block_hash)
            blk.block_hash = blk.token_ids = blk.parent_hash = None

    def _incref(self, bid: int) -> None:
        blk = self.blocks[bid]
        if blk.ref_count == 0:
            del self.free_queue[bid]
        blk.ref_count += 1

    def _decref(self, bid: int) -> None:
        blk = self.blocks[bid]
        assert blk.ref_count > 0, f"double free of block {bid}"
        blk.ref_count -= 1
        if blk.ref_count == 0:
            self.free_queue[bid] = None
