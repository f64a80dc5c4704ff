"""Oracle results kept across test runs: the float64 reference forward and llama.cpp's logits
are pure functions of a model file, the tokens and the oracle's own code, and recomputing them
for the real models took ~5 minutes of every CI run (the 1.5B's float64 forward alone ~2).

A result lives in <edge-infer cache>/oracle/<kind>/<key>.npz, the key a sha256 of every input
the caller names plus numpy's and Python's versions; callers name the model by its content
(file_digest), the oracle by its sources (source_digest) and llama.cpp by its build
(llama_cpp_build). Files under CACHED_FROM bytes and results computed in under KEEP_FROM_S
are not kept; a result unread for UNUSED_DAYS, or the least recently read past CAP_BYTES of
its kind, is deleted. Only our side is computed every run, so a cached oracle still checks it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.hub import cache_dir

CACHED_FROM = 32 << 20  # bytes: smaller (tiny test) files compute in moments and change with their writers
KEEP_FROM_S = 1.5  # a result computed faster is not kept: reading it back saves little for its disk
UNUSED_DAYS = 30  # a result not read for this long is deleted (its inputs have changed)
CAP_BYTES = 6 << 30  # per kind: past this, the least recently read results are deleted
_DIGESTS: dict[tuple[str, int, int], str] = {}


def keeps(path: str | Path) -> bool:
    """Whether results on this model file are kept: inside a pytest test (benchmarks using the
    oracles compute) and for a file of CACHED_FROM bytes or more."""
    return "PYTEST_CURRENT_TEST" in os.environ and Path(path).stat().st_size >= CACHED_FROM


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (remembered per process by path, size and mtime)."""
    st = Path(path).stat()
    memo = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if memo not in _DIGESTS:
        with open(path, "rb") as f:
            _DIGESTS[memo] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[memo]


def source_digest(*files: str | Path) -> str:
    """sha256 of these source files (the oracle's code)."""
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def llama_cpp_build(lc: Any) -> str:
    """llama-cpp-python's version, system info and the bytes of its shared libraries."""
    h = hashlib.sha256(lc.__version__.encode() + b"\0" + lc.llama_print_system_info() + b"\0")
    for lib in sorted(Path(lc.__file__).parent.rglob("*.so*")):
        h.update(lib.name.encode() + b"\0" + file_digest(lib).encode())
    return h.hexdigest()


def cached_arrays(
    kind: str, parts: Sequence[object], compute: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """compute()'s named arrays, read back when the same inputs (`parts`, each by its repr)
    were computed before; written under a temporary name and renamed, never read half-written."""
    every = [*map(repr, parts), np.__version__, sys.version, platform.machine()]
    key = hashlib.sha256("\0".join(every).encode()).hexdigest()
    path = cache_dir() / "oracle" / kind / f"{key}.npz"
    if path.exists():
        try:
            with np.load(path) as z:
                got = {k: z[k] for k in z.files}
            os.utime(path)  # in use: kept by _prune
            return got
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # damaged: computed again and replaced
            pass
    start = time.perf_counter()
    arrays = compute()
    if time.perf_counter() - start < KEEP_FROM_S:
        return arrays
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _prune(path.parent)
        tmp = temp_beside(path)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        commit(tmp, path)
    except OSError as e:  # a full or read-only disk: the result stands, only not kept
        warnings.warn(f"oracle result not kept in {path.parent}: {e}", stacklevel=2)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return arrays


def _prune(folder: Path, cap: int = CAP_BYTES) -> None:
    """Delete the results in folder not read or written for UNUSED_DAYS, then the least
    recently read ones while the rest exceed `cap` bytes (room for the one being written)."""
    entries = []
    for f in folder.glob("*.npz"):
        try:
            st = f.stat()
        except FileNotFoundError:  # another worker's prune
            continue
        entries.append((st.st_mtime, st.st_size, f))
    entries.sort()  # oldest first
    cutoff, total = time.time() - UNUSED_DAYS * 86400, sum(size for _, size, _ in entries)
    for mtime, size, f in entries:
        if mtime >= cutoff and total <= cap:
            break
        f.unlink(missing_ok=True)
        total -= size


def reference_logits(path: str | Path, ids: list[int]) -> np.ndarray:
    """reference_forward.reference_logits(path, ids), kept for a real model's file: keyed by the
    file's bytes, the ids, reference_forward's source and the sources the reference dequantizer
    and reader import."""
    import reference_forward

    from edge_infer.kernels_cpu.jit_cache import source_stamp

    if not keeps(path):
        return reference_forward.reference_logits(path, ids)
    parts = ("reference_logits", file_digest(path), ids, source_digest(reference_forward.__file__),
             source_stamp("edge_infer.formats.quants"))
    return cached_arrays("reference", parts, lambda: {"logits": reference_forward.reference_logits(path, ids)})["logits"]
