"""The block manager's side of the disk prefix cache (engine/disk_prefix.py): the evicted
blocks to save, the cached blocks at shutdown, the prompt's run already in memory, and free
blocks adopted as cached ones for the blocks loaded from disk. A part of BlockManager (its
internals: the blocks, the free queue, the cache map), in a file of its own for size; only
Python ints, tuples and lists."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class DiskBlocks:
    blocks: list[Any]  # block_manager.Block (not imported: that module imports this one)
    free_queue: OrderedDict[int, None]
    cached: dict[int, int]
    block_size: int
    enable_prefix_caching: bool
    _evicted: list[tuple[int, int, int | None, tuple[int, ...]]]

    @staticmethod
    def hash_block(parent: int | None, token_ids: tuple[int, ...]) -> int:
        raise NotImplementedError

    def _pop_free(self) -> int:
        raise NotImplementedError

    def take_evictions(self) -> list[tuple[int, int, int | None, tuple[int, ...]]]:
        """The cached blocks handed out again since the last call (record_evictions on)."""
        out, self._evicted = self._evicted, []
        return out

    def cached_blocks(self) -> list[tuple[int, int, int | None, tuple[int, ...]]]:
        """(block id, hash, parent hash, token ids) of every block in the prefix cache."""
        out = []
        for h, bid in self.cached.items():
            blk = self.blocks[bid]
            assert blk.token_ids is not None
            out.append((bid, h, blk.parent_hash, blk.token_ids))
        return out

    def block_key(self, bid: int) -> tuple[int, int | None, tuple[int, ...]] | None:
        """A cached block's (hash, parent hash, token ids); None when it is not cached."""
        blk = self.blocks[bid]
        if blk.block_hash is None or blk.token_ids is None or self.cached.get(blk.block_hash) != bid:
            return None
        return blk.block_hash, blk.parent_hash, blk.token_ids

    def adopt(self, parent: int | None, token_ids: tuple[int, ...]) -> int | None:
        """A free block registered in the prefix cache as (parent, token_ids)'s, left free (the
        next allocate of a prompt with that prefix claims it): for the disk cache to fill. None
        when it is cached already or no block is free."""
        h = self.hash_block(parent, token_ids)
        if not self.enable_prefix_caching or h in self.cached or not self.free_queue:
            return None
        bid = self._pop_free()
        blk = self.blocks[bid]
        blk.block_hash, blk.token_ids, blk.parent_hash = h, token_ids, parent
        self.cached[h] = bid
        blk.ref_count = 0
        self.free_queue[bid] = None  # the most recently used end
        return bid

    def memory_prefix(self, token_ids: list[int]) -> tuple[int, int | None]:
        """How many of token_ids' full blocks (leaving one token) are cached in memory, in a
        run from the first, and the last one's hash; the free ones among them become the most
        recently used (the disk cache fills the blocks after them without evicting them)."""
        parent: int | None = None
        bs, n = self.block_size, 0
        for i in range((len(token_ids) - 1) // bs if self.enable_prefix_caching else 0):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, chunk)
            bid = self.cached.get(h)
            if bid is None or self.blocks[bid].token_ids != chunk:
                break
            if bid in self.free_queue:
                self.free_queue.move_to_end(bid)
            parent, n = h, n + 1
        return n, parent

