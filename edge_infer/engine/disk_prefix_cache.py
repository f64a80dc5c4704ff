"""A prefix cache on disk (`prefix_cache_dir`): full KV blocks that survive the process.

A block leaves memory when the block manager hands a cached block out again (eviction) or at
shutdown; its K/V (every attention layer's rows of the block, copied on the engine thread
before anything can overwrite them) are written by a background thread, so the engine never
waits on the disk. A new request's prompt looks its full blocks up after the ones still in
memory: each found file is read, verified and put into a free block as a cached block, where
the scheduler's ordinary prefix hit claims it.

Files: DIR/<model fingerprint>/<2 hex>/<block hash as 16 hex>.kv, each
    MAGIC, header (block hash, parent hash, token count, array count) int64, the block's token
    ids int32, each array's byte count int64, the arrays' bytes, sha256 of all before.
A hybrid model's recurrent state after a block (its snapshot) is a file of the same form beside
it, named <block hash>.st (STATE), written and read on its own: a block may be on disk without
its state, and a prefix hit of a hybrid ends at the last block with one.
The fingerprint (model_fingerprint) covers the model file's identity, the KV types, the block
size, the RoPE settings and the Python hash the chain of block hashes is made of, so another
model's or another layout's blocks are never looked at. A file whose digest, sizes, hashes or
token ids do not match is a miss (a corrupted, truncated or misnamed one is also logged and
deleted, so the block is saved again whole):
never wrong output. Writes go to a temporary name and are renamed into place (atomic), so two
processes sharing the directory see whole files or none; the size cap (LRU by modification
time, touched on every hit) is enforced under an exclusive lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import queue
import struct
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("edge_infer.engine")

MAGIC = b"EIKVBLK1"
_DIGEST = 32
_QUEUE_BLOCKS = 4096  # blocks waiting for the writer; past it a save is dropped (the cache is best effort)
BLOCK, STATE = ".kv", ".st"  # a block's K/V; a hybrid model's recurrent state after the block


def model_fingerprint(model_path: str, identity: str, kv_types: tuple[str, str], block_size: int,
                      rope: tuple[Any, ...]) -> str:
    """The directory name of one model's blocks: what a block's bytes depend on besides its tokens."""
    h = hashlib.sha256()
    for part in (MAGIC.decode(), os.path.basename(model_path), identity, *kv_types, block_size, repr(rope),
                 sys.hash_info.algorithm, sys.version_info[:2]):
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:32]


def file_identity(path: str) -> str:
    """The model file's sha256 (the hub's marker when valid), or its size, mtime and first MiB
    where no marker can be written beside it."""
    from edge_infer.hub.cache import file_digest

    try:
        return file_digest(Path(path), False)
    except OSError:
        st = os.stat(path)
        with open(path, "rb") as f:
            head = hashlib.sha256(f.read(1 << 20)).hexdigest()
        return f"{st.st_size}:{st.st_mtime_ns}:{head}"


class DiskPrefixCache:
    """One model's blocks in `root` (the prefix_cache_dir), at most max_bytes of them."""

    def __init__(self, root: str, fingerprint: str, max_bytes: int) -> None:
        self.dir = Path(root) / fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock_path = Path(root) / ".lock"
        self._queue: queue.Queue[tuple[int, int, tuple[int, ...], list[np.ndarray], str] | None] = queue.Queue(
            _QUEUE_BLOCKS)
        self._known: set[tuple[str, int]] = set()  # (kind, hash) written by this process (no second write)
        # (kind, hash) -> (parent, tokens, arrays) queued and not yet written: a load serves them
        # from here (a prompt may come back before the writer thread reaches its blocks)
        self._pending: dict[tuple[str, int], tuple[int, tuple[int, ...], list[np.ndarray]]] = {}
        self._added = 0  # bytes written since the last pruning
        self.stats = {"disk_hits": 0, "disk_misses": 0, "disk_writes": 0, "disk_corrupt": 0, "disk_dropped": 0}
        self._writer = threading.Thread(target=self._write_loop, name="edge-infer-prefix-disk", daemon=True)
        self._writer.start()

    # -- paths and format ------------------------------------------------------------------------
    def _path(self, block_hash: int, kind: str = BLOCK) -> Path:
        name = f"{block_hash & 0xFFFFFFFFFFFFFFFF:016x}"
        return self.dir / name[:2] / f"{name}{kind}"

    def has(self, block_hash: int, kind: str = BLOCK) -> bool:
        """Whether a file of this kind (BLOCK or STATE) exists for the block, or is queued."""
        return (kind, block_hash) in self._known or self._path(block_hash, kind).is_file()

    @staticmethod
    def _encode(block_hash: int, parent: int, tokens: tuple[int, ...], arrays: list[np.ndarray]) -> bytes:
        head = MAGIC + struct.pack("<4q", block_hash, parent, len(tokens), len(arrays))
        body = [head, np.asarray(tokens, np.int32).tobytes(), np.asarray([a.nbytes for a in arrays], np.int64).tobytes()]
        body += [np.ascontiguousarray(a).tobytes() for a in arrays]
        data = b"".join(body)
        return data + hashlib.sha256(data).digest()

    def _decode(self, data: bytes, block_hash: int, parent: int, tokens: tuple[int, ...],
                like: list[np.ndarray]) -> list[np.ndarray] | None:
        """The arrays, shaped as `like`; None on a mismatch; ValueError when the file is damaged."""
        if len(data) < len(MAGIC) + 32 + _DIGEST or data[: len(MAGIC)] != MAGIC:
            raise ValueError("not a block file (bad magic or too short)")
        if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
            raise ValueError("its digest does not match (truncated or corrupted)")
        at = len(MAGIC)
        h, p, n_tok, n_arr = struct.unpack_from("<4q", data, at)
        at += 32
        if h != block_hash:
            raise ValueError("it holds another block (its hash differs from its name)")
        if p != parent or n_tok != len(tokens) or n_arr != len(like):
            return None
        if tuple(np.frombuffer(data, np.int32, n_tok, at).tolist()) != tuple(tokens):
            return None  # a hash collision: another prefix's block
        at += 4 * n_tok
        sizes = np.frombuffer(data, np.int64, n_arr, at)
        at += 8 * n_arr
        out = []
        for size, ref in zip(sizes.tolist(), like):
            if size != ref.nbytes:
                return None
            out.append(np.frombuffer(data, ref.dtype, ref.size, at).reshape(ref.shape))
            at += size
        if at != len(data) - _DIGEST:
            raise ValueError("its sizes do not add up")
        return out

    # -- reads (engine thread) ---------------------------------------------------------------------
    def load(self, block_hash: int, parent: int, tokens: tuple[int, ...], like: list[np.ndarray],
             kind: str = BLOCK) -> list[np.ndarray] | None:
        """The block's arrays of this kind (shaped as `like`) when a verified file holds them, else None."""
        queued = self._pending.get((kind, block_hash))
        if queued is not None:
            return self._from_queue(queued, parent, tokens, like)
        path = self._path(block_hash, kind)
        try:
            data = path.read_bytes()
        except OSError:
            self.stats["disk_misses"] += 1
            return None
        try:
            arrays = self._decode(data, block_hash, parent, tokens, like)
        except ValueError as e:
            self.stats["disk_corrupt"] += 1
            log.warning("prefix cache: %s is damaged (%s): removed, a miss", path, e)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        if arrays is None:
            self.stats["disk_misses"] += 1
            return None
        self.stats["disk_hits"] += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be pruned
        return arrays

    def _from_queue(self, queued: tuple[int, tuple[int, ...], list[np.ndarray]], parent: int,
                    tokens: tuple[int, ...], like: list[np.ndarray]) -> list[np.ndarray] | None:
        """A queued block's arrays, checked as a file's are (its parent, tokens and shapes)."""
        q_parent, q_tokens, arrays = queued
        if q_parent != parent or q_tokens != tuple(tokens) or len(arrays) != len(like) or \
                any(a.nbytes != ref.nbytes or a.dtype != ref.dtype for a, ref in zip(arrays, like)):
            self.stats["disk_misses"] += 1
            return None
        self.stats["disk_hits"] += 1
        return [a.reshape(ref.shape) for a, ref in zip(arrays, like)]

    # -- writes (a background thread) --------------------------------------------------------------
    def save(self, block_hash: int, parent: int, tokens: tuple[int, ...], arrays: list[np.ndarray],
             kind: str = BLOCK) -> None:
        """Queue the block's arrays of this kind (copies the caller will not touch again) for writing."""
        if self.has(block_hash, kind):
            return
        try:
            self._pending[(kind, block_hash)] = (parent, tuple(tokens), arrays)  # before the writer can pop it
            self._queue.put_nowait((block_hash, parent, tokens, arrays, kind))
            self._known.add((kind, block_hash))
        except queue.Full:
            self._pending.pop((kind, block_hash), None)
            self.stats["disk_dropped"] += 1

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self._queue.join()

    def close(self) -> None:
        """Write everything queued, then stop the writer. Idempotent."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._write(*item)
            except OSError as e:  # a full or read-only disk: the cache is best effort
                log.warning("prefix cache: could not write a block to %s: %s", self.dir, e)
            finally:
                self._pending.pop((item[4], item[0]), None)  # written (or failed): loads read the file
                self._queue.task_done()

    def _write(self, block_hash: int, parent: int, tokens: tuple[int, ...], arrays: list[np.ndarray],
               kind: str) -> None:
        path = self._path(block_hash, kind)
        if path.is_file():  # another process wrote it
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self._encode(block_hash, parent, tokens, arrays)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: readers see the whole file or none
        self.stats["disk_writes"] += 1
        self._added += len(data)
        if self._added > self.max_bytes // 16:
            self._added = 0
            self.prune()

    def prune(self) -> None:
        """Delete the least recently used files of every model under the root until the root
        holds at most max_bytes, under the root's lock (two processes never prune at once)."""
        with open(self._lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                files = []
                for p in (p for kind in (BLOCK, STATE) for p in self.dir.parent.glob(f"*/*/*{kind}")):
                    with contextlib.suppress(OSError):
                        st = p.stat()
                        files.append((st.st_mtime_ns, st.st_size, p))
                total = sum(f[1] for f in files)
                for _, size, p in sorted(files, key=lambda f: f[0]):
                    if total <= self.max_bytes:
                        break
                    with contextlib.suppress(OSError):
                        p.unlink()
                    total -= size
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
