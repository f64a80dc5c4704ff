"""Paged KV blocks: allocation, reference counts, automatic prefix caching, copy-on-write.

The interface: can_allocate, allocate, append_slots, truncate, fork, free, cache_full_blocks,
take_copies, reset_prefix_cache and the read-only counters; nothing outside touches the
blocks, the free queue or the cache map. Only Python ints and lists: the model runner turns
block tables into arrays.

State slots (hybrid models): a recurrent layer keeps one fixed-size state per sequence, not per
token. The manager hands out num_state_slots slot ids beside the blocks: a sequence takes one
when it first gets blocks (an admitted request's n > 1 samples reserve theirs with it, so a fork
never waits), gives it back when freed, and a fork queues a state copy as copy-on-write queues
a block copy. A state cannot be rolled back, and a cached prefix would need the state at its
end, so with state slots the prefix cache finds nothing and truncate refuses to shorten.

Prefix caching: a full block is identified by hash((parent block's hash, its token ids)), so
equal hashes mean equal prefixes (the token ids are kept to rule out collisions). A block
whose reference count drops to zero goes to the back of the free queue but stays findable by
its hash until it is handed out again: the free queue is the LRU eviction order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from edge_infer.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None  # set with block_hash


class BlockManager:
    """num_blocks blocks of block_size token slots; block ids are 0..num_blocks-1."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 num_state_slots: int = 0) -> None:
        if num_blocks < 1 or block_size < 1 or num_state_slots < 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size} "
                             f"({num_state_slots} state slots)")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_state_slots = num_state_slots
        self.enable_prefix_caching = enable_prefix_caching and not num_state_slots
        self.free_slots = list(range(num_state_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._pending_state_copies: list[tuple[int, int]] = []
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self._pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) for the runner
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found

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
        return hash((parent, token_ids))

    def find_cached_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest cached run of full blocks that prefixes token_ids, leaving at
        least one token to compute (a step must produce logits)."""
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        parent: int | None = None
        bs = self.block_size
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, chunk)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != chunk:
                break
            found.append(bid)
            parent = h
        return found

    # -- allocation ----------------------------------------------------------------------------
    def _slots_wanted(self, seq: Sequence) -> int:
        """State slots seq and its unforked samples still need (0 without state slots)."""
        if not self.num_state_slots:
            return 0
        return sum(1 for s in (seq, *seq.followers) if s.state_slot < 0)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether append_slots(seq, num_new_tokens) would succeed (admission: counts prefix hits
        and the state slots of seq and its n > 1 samples)."""
        if self._slots_wanted(seq) > len(self.free_slots):
            return False
        if not seq.block_table:
            hits = self.find_cached_prefix(seq.all_token_ids())
            reclaim = sum(1 for b in hits if self.blocks[b].ref_count == 0)
            total = max(len(hits) * self.block_size, seq.num_computed_tokens) + num_new_tokens
            return self.blocks_needed(total) - len(hits) + reclaim <= self.num_free_blocks
        return self._extra_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> int:
        """Admit a new sequence: claim its cached prefix blocks; returns the tokens they cover
        (which become seq.num_computed_tokens)."""
        assert not seq.block_table, "allocate() is for sequences without blocks"
        if self.num_state_slots:
            for s in (seq, *seq.followers):
                if s.state_slot < 0:
                    s.state_slot = self.free_slots.pop()
        tokens = seq.all_token_ids()
        hits = self.find_cached_prefix(tokens)
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
        if self.num_state_slots and seq.state_slot < 0:
            if not self.free_slots:
                return False
            seq.state_slot = self.free_slots.pop()
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
        if self.num_state_slots:
            if child.state_slot < 0:
                assert self.free_slots, "a fork without a reserved state slot"
                child.state_slot = self.free_slots.pop()
            self._pending_state_copies.append((parent.state_slot, child.state_slot))
        for bid in parent.block_table:
            self._incref(bid)
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Keep only the blocks that hold seq's first num_tokens tokens; the rest go back to the
        pool (rejected speculative tokens, a draft rolled back to what the target accepted)."""
        if self.num_state_slots and num_tokens < seq.num_computed_tokens:
            raise RuntimeError("a recurrent state cannot be rolled back (speculation is off for hybrid models)")
        keep = self.blocks_needed(max(num_tokens, 0))
        while len(seq.block_table) > keep:
            self._decref(seq.block_table.pop())

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies that copy-on-write asked for since the last call; the KV
        pool must do them before the next forward writes into dst."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    def take_state_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) state-slot copies forks asked for since the last call; done before the
        next forward, like take_copies'."""
        copies, self._pending_state_copies = self._pending_state_copies, []
        return copies

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks; the tail first, so prefix blocks stay cached the longest."""
        for bid in reversed(seq.block_table):
            self._decref(bid)
        seq.block_table = []
        if seq.state_slot >= 0:
            slot, seq.state_slot = seq.state_slot, -1
            # a fork's copy into it not done yet must not land on the slot's next owner
            self._pending_state_copies = [c for c in self._pending_state_copies if c[1] != slot]
            self.free_slots.append(slot)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register seq's blocks that are now full of computed tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent: int | None = None
        # computed slots past num_tokens hold speculative proposals: never cache those
        for i in range(min(min(seq.num_computed_tokens, seq.num_tokens) // bs, len(seq.block_table))):
            blk = self.blocks[seq.block_table[i]]
            if blk.block_hash is not None:
                parent = blk.block_hash
                continue
            chunk = tuple(seq.tokens_slice(i * bs, (i + 1) * bs))
            h = self.hash_block(parent, chunk)
            if h not in self.cached:  # a duplicate computed concurrently stays private
                blk.block_hash, blk.token_ids = h, chunk
                self.cached[h] = blk.block_id
            parent = h

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no sequence uses (e.g. after weights change)."""
        for bid in self.free_queue:
            self._uncache(self.blocks[bid])

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
            blk.block_hash = blk.token_ids = None

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
