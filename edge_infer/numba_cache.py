"""numba's on-disk cache made safe for processes that share a cache folder (two test workers, a
server beside a script, the aarch64 job's two emulated steps).

numba's IndexDataCacheFile.save reads a function's index, picks the first free data file name,
saves the index, then the data. Two processes adding different signatures of one function at
once can pick the same name, and the index that wins then maps one signature to the other's
compiled code (run with the wrong argument types); a reader between the two saves can load a
stale file of that name. lock_cache_saves() replaces the save: the read, the pick and the two
writes hold an exclusive lock on the index, and the data is written before the index names it.
numba_codegen.py installs it, before the package defines its first numba function.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from numba.core.caching import IndexDataCacheFile


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if absent), across processes and threads;
    no lock where the platform has no fcntl (Windows: numba's own unlocked save)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _save_under_lock(self: IndexDataCacheFile, key: Any, data: Any) -> None:
    """IndexDataCacheFile.save: the data first, then the index that names it, under the lock."""
    with file_lock(self._index_path + ".lock"):
        overloads = self._load_index()
        name = overloads.get(key)
        if name is None:
            used = set(overloads.values())
            name = next(n for n in map(self._data_name, itertools.count(1)) if n not in used)
        self._save_data(name, data)
        if overloads.get(key) != name:
            overloads[key] = name
            self._save_index(overloads)


def lock_cache_saves() -> None:
    """Make every numba cache save of this process go through _save_under_lock (idempotent)."""
    IndexDataCacheFile.save = _save_under_lock  # type: ignore[method-assign]
