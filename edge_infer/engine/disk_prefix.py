"""The engine's side of the disk prefix cache (disk_prefix_cache.py holds the files): which
blocks go to disk and when, and how a prompt's blocks come back.

- Saving: the block manager records the cached blocks it hands out again (evictions); the
  runner calls `save_evicted` first in every forward, before the block copies and the step's
  K/V stores can overwrite them, and their copies are queued for the writer thread. At
  shutdown (`close`) every block still cached in memory is saved the same way.
- Loading: `fill(prompt ids)` before the request is queued: past the run of its full blocks
  cached in memory, each block found and verified on disk is put into a free block the block
  manager registers as cached (`adopt`); the scheduler's ordinary prefix hit then claims them.
- Hybrid models: a block's state snapshot (the recurrent state after it, state_slots.py) is
  saved when it is let go (with its block, or for a newer snapshot) and at shutdown, and loaded
  into a snapshot slot beside its block, also for a block still in memory whose snapshot went;
  a prefix hit of a hybrid ends at the last block with a snapshot, as in memory.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

from edge_infer.config import EngineConfig, RuntimePlan
from edge_infer.engine.block_manager import ROOT_HASH, BlockManager
from edge_infer.engine.disk_prefix_cache import STATE, DiskPrefixCache, file_identity, model_fingerprint
from edge_infer.engine.model_runner import ModelRunner
from edge_infer.engine.prefill import Prefill
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import InvalidRequest
from edge_infer.models.config import ModelConfig
from edge_infer.sampling_params import SamplingParams

log = logging.getLogger("edge_infer.engine")


class DiskPrefix:
    def __init__(self, cache: DiskPrefixCache, bm: BlockManager, runner: ModelRunner) -> None:
        self.cache, self.bm, self.runner = cache, bm, runner
        self._like = runner.read_block(0)  # the arrays' shapes and dtypes a file must have
        self.states = bm.states  # a hybrid model's state slots, else None
        self._like_state = runner.read_state(0) if self.states is not None else []
        bm.record_evictions = True  # the state slots' too
        runner.before_forward = self.save_evicted

    def save_evicted(self) -> None:
        keys = {}
        for bid, h, parent, tokens in self.bm.take_evictions():
            keys[h] = (parent, tokens)
            self.cache.save(h, ROOT_HASH if parent is None else parent, tokens, self.runner.read_block(bid))
        for h, slot in self.states.take_evictions() if self.states is not None else ():
            key = keys.get(h) or self._cached_key(h)
            if key is not None:  # its block is in memory, or was let go with it
                self._save_state(h, *key, slot)

    def _cached_key(self, h: int) -> tuple[int | None, tuple[int, ...]] | None:
        bid = self.bm.cached.get(h)
        key = self.bm.block_key(bid) if bid is not None else None
        return None if key is None else key[1:]

    def _save_state(self, h: int, parent: int | None, tokens: tuple[int, ...], slot: int) -> None:
        self.cache.save(h, ROOT_HASH if parent is None else parent, tokens, self.runner.read_state(slot), STATE)

    def fill(self, ids: list[int]) -> int:
        """Load the prompt's blocks found on disk after those in memory; returns how many. A
        hybrid's: then the state after the last block of the run that has one on disk, where no
        later block of the run has a snapshot in memory (a prefix hit ends at the last snapshot)."""
        bs = self.bm.block_size
        n_mem, parent = self.bm.memory_prefix(ids)
        room = self.bm.num_free_blocks - n_mem - 1  # never evict the run in memory (now the most recent)
        loaded = 0
        for i in range(n_mem, (len(ids) - 1) // bs):
            chunk = tuple(ids[i * bs : (i + 1) * bs])
            h = self.bm.hash_block(parent, chunk)
            if loaded >= room or not self.cache.has(h):
                break
            arrays = self.cache.load(h, ROOT_HASH if parent is None else parent, chunk, self._like)
            if arrays is None:
                break
            bid = self.bm.adopt(parent, chunk)
            if bid is None:
                break
            self.save_evicted()  # the adopted block may have held a cached block: saved before it is overwritten
            self.runner.write_block(bid, arrays)
            parent, loaded = h, loaded + 1
        if self.states is not None:
            self._fill_state(ids, n_mem + loaded)
        return loaded

    def _fill_state(self, ids: list[int], n_blocks: int) -> None:
        bs, st = self.bm.block_size, self.states
        chain: list[tuple[int, int | None, tuple[int, ...]]] = []
        up: int | None = None
        assert st is not None
        for i in range(n_blocks):  # (hash, parent, tokens) of the run's blocks, first to last
            chunk = tuple(ids[i * bs : (i + 1) * bs])
            chain.append((self.bm.hash_block(up, chunk), up, chunk))
            up = chain[-1][0]
        for h, parent, chunk in reversed(chain):
            if h in st.snapshot_of:  # the hit reaches this far already
                return
            if not self.cache.has(h, STATE):
                continue
            arrays = self.cache.load(h, ROOT_HASH if parent is None else parent, chunk, self._like_state, STATE)
            slot = st.reserve_snapshot() if arrays is not None else None
            if arrays is not None and slot is not None:
                self.save_evicted()  # the slot may have held another block's snapshot: saved before it is overwritten
                self.runner.write_state(slot, arrays)
                st.link(h, slot)
                return

    # -- named prefixes: the server's /slots/{name}?action=save|restore|erase -------------------
    def _named(self, name: str) -> Path:
        return self.cache.dir.parent / "slots" / self.cache.dir.name / f"{name}.json"

    def save_named(self, name: str, ids: list[int], prefill: Prefill, budget: int) -> dict[str, int]:
        """Compute ids' K/V (what is not cached already), write its full blocks to disk now and
        record their tokens under `name`; {"n_saved": tokens, "n_written": bytes}."""
        bs, seq = self.bm.block_size, Sequence("__save_prefix__", ids, SamplingParams(max_tokens=1))
        prefill.claim_cached(seq)
        saved = 0
        for _ in prefill.chunked([seq], budget, lambda i, start, end: [end - start - 1], "save a prefix"):
            if seq.num_computed_tokens == seq.num_tokens:  # done: its full blocks, cached, to disk
                prefill.cache_blocks(seq)
                for bid in seq.block_table[: len(ids) // bs]:
                    key = self.bm.block_key(bid)
                    if key is None:  # a duplicate of a block cached by another sequence meanwhile
                        break
                    h, parent, tokens = key
                    self.cache.save(h, ROOT_HASH if parent is None else parent, tokens, self.runner.read_block(bid))
                    self._save_snapshot(h, parent, tokens)
                    saved += 1
        self.cache.flush()
        path = self._named(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"tokens": ids[: saved * bs]}))
        os.replace(tmp, path)
        return {"n_saved": saved * bs, "n_written": saved * sum(a.nbytes for a in self._like)}

    def restore_named(self, name: str) -> dict[str, int]:
        """Put a saved prefix's blocks into the pool as cached blocks: the next request that
        starts with it computes only the rest. {"n_restored": tokens in the pool, "n_read": bytes}."""
        ids = self._tokens_of(name)
        n_mem, _ = self.bm.memory_prefix(ids + [0])
        loaded = self.fill(ids + [0])  # the blocks end where the saved tokens do
        return {"n_restored": (n_mem + loaded) * self.bm.block_size,
                "n_read": loaded * sum(a.nbytes for a in self._like)}

    def erase_named(self, name: str) -> dict[str, int]:
        """Forget a saved prefix's name (its blocks stay in the cache, least recently used)."""
        n = len(self._tokens_of(name))
        self._named(name).unlink(missing_ok=True)
        return {"n_erased": n}

    def _tokens_of(self, name: str) -> list[int]:
        try:
            tokens = json.loads(self._named(name).read_text())["tokens"]
        except FileNotFoundError:
            raise InvalidRequest(f"no prefix is saved under the name {name!r} for this model") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidRequest(f"the prefix saved as {name!r} cannot be read ({e})") from None
        return [int(t) for t in tokens]

    def close(self) -> None:
        """Save every block still cached in memory, then finish the writes."""
        self.save_evicted()
        for bid, h, parent, tokens in self.bm.cached_blocks():
            self.cache.save(h, ROOT_HASH if parent is None else parent, tokens, self.runner.read_block(bid))
            self._save_snapshot(h, parent, tokens)
        self.cache.close()

    def _save_snapshot(self, h: int, parent: int | None, tokens: tuple[int, ...]) -> None:
        slot = self.states.snapshot_of.get(h) if self.states is not None else None
        if slot is not None:
            self._save_state(h, parent, tokens, slot)


def open_disk_prefix(config: EngineConfig, plan: RuntimePlan, cfg: ModelConfig, bm: BlockManager,
                     runner: ModelRunner) -> DiskPrefix | None:
    """The engine's disk prefix cache when prefix_cache_dir is set and the model can use one."""
    if config.prefix_cache_dir is None:
        return None
    if not bm.enable_prefix_caching:
        log.warning("prefix_cache_dir has no effect with enable_prefix_caching=False%s",
                    " (or a hybrid model without state snapshots)" if cfg.recurrent else "")
        return None
    rope = tuple((f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if "rope" in f.name)
    kv = (plan.kv_cache_dtype, plan.kv_cache_dtype_v or plan.kv_cache_dtype)
    fp = model_fingerprint(plan.model_path, file_identity(plan.model_path), kv, plan.block_size, rope)
    assert isinstance(config.prefix_cache_disk_size, int)
    return DiskPrefix(DiskPrefixCache(config.prefix_cache_dir, fp, config.prefix_cache_disk_size), bm, runner)
