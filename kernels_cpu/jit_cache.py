"""numba's on-disk cache of the compiled kernels: where it is, which kernels it holds for this
CPU and this source, and a hook on the first kernel a process has to compile (so a command
line can say why the first run takes a minute).

numba keys a cached kernel by its signature, the target (LLVM triple, CPU name, features) and a
hash of the function's bytecode; an entry from another CPU or an older source does not count.
The index files are read with numba's own cache classes (private API, stable since 0.49): if
that ever fails, the status says "unknown" rather than guessing. The locator stamps each kernel
module with the sources of the modules it imports (source_stamp), where numba's own stamp covers
only the kernel's file: a change to one kernel family recompiles only the modules that import
it. (Saves locked against other processes filling the same folder: edge_infer/numba_cache.py.)
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib
import importlib.util
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numba.core import config, event
from numba.core.caching import IndexDataCacheFile, UserProvidedCacheLocator

# The modules with kernels (and the non-inlined helpers they call) of this package.
KERNEL_MODULES = ("attention", "dequant", "matmul", "matmul_i8", "matmul_k", "matmul_experts", "membw", "moe",
                  "ops", "recurrent", "repack_i8", "repack_k", "simd_i8", "simd_k")
_PACKAGE = __name__.rsplit(".", 1)[0]
_TOP = _PACKAGE.split(".", 1)[0]
# The folders whose kernels SourceTreeCacheLocator keys by the sources they import.
_KERNEL_DIRS = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "formats")
# What NUMBA_CACHE_LOCATOR_CLASSES names to use it (numba's own locators after it, for every
# other cached function).
CACHE_LOCATORS = ",".join([f"{__name__}.SourceTreeCacheLocator"] + [
    f"numba.core.caching.{c}" for c in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")])


@functools.cache
def _source_file(module: str) -> str | None:
    """The .py file of one of this package's modules (None: not a module, not ours, or this one,
    which holds no kernel code)."""
    if module.split(".", 1)[0] != _TOP or module == __name__:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent that is not a package, or a broken name
        return None
    return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None


# An import statement whole (a parenthesized name list may span lines), at any indent: parsing
# only these lines, where parsing every kernel source whole took 0.65 s of each process's start.
_IMPORT_LINES = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]*(?:\([^)]*\)|.*)|import[ \t].*)$", re.M)


def import_statements(source: str, path: str = "<source>") -> list[ast.stmt]:
    """The Import / ImportFrom statements of a module's source, at any depth. A line the pattern
    takes that is not a whole statement (a backslash continuation, prose in a docstring) fails to
    parse, and then the whole source is parsed instead; a statement inside a string can only add
    a module to a stamp, never leave one out."""
    try:
        return [node for m in _IMPORT_LINES.finditer(source) for node in ast.parse(m.group(0).strip(), path).body]
    except SyntaxError:
        return [n for n in ast.walk(ast.parse(source, path)) if isinstance(n, ast.Import | ast.ImportFrom)]


@functools.cache
def _imports(module: str) -> frozenset[str]:
    """This package's modules that `module`'s source imports, relative or absolute, at any depth
    (function-level imports too: numba freezes whatever a kernel reaches at compile time)."""
    path = _source_file(module)
    if path is None:
        return frozenset()
    is_package = Path(path).name == "__init__.py"
    out: set[str] = set()
    for node in import_statements(Path(path).read_text(), path):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                parent = ".".join(base + ([node.module] if node.module else []))
            else:
                parent = node.module or ""
            for a in node.names:  # `from package import module`, else a name of `parent`
                out.add(f"{parent}.{a.name}" if _source_file(f"{parent}.{a.name}") else parent)
    return frozenset(m for m in out if _source_file(m) is not None)


@functools.cache
def import_closure(module: str) -> tuple[str, ...]:
    """`module` and every module of this package it imports, directly or through others, sorted."""
    seen, todo = {module}, [module]
    while todo:
        for dep in _imports(todo.pop()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return tuple(sorted(seen))


@functools.cache
def source_stamp(module: str) -> str:
    """sha256 of the sources of `module`'s import closure. Kernels inline helpers from the
    modules they import and freeze those modules' constants (type ids) into their code, so a
    change in any of them must miss the cache; numba's own stamp covers only the kernel's file.
    A change elsewhere (a quantizer, another kernel family) leaves this module's kernels cached."""
    h = hashlib.sha256()
    for name in import_closure(module):
        path = _source_file(name)
        h.update(name.encode() + b"\0" + (Path(path).read_bytes() if path else b"") + b"\0")
    return h.hexdigest()


# The stamp every index of this package's kernels carried before source_stamp (one digest of
# all the kernel folders' sources), and the digest of those same sources less this file, which
# holds no kernel code. While the folders still hold exactly those sources (this file aside),
# an index with the old stamp holds the same compiled code a compile would give now, so it is
# taken and re-stamped instead of compiling everything again once (about 45 minutes of CI on
# two cores, where the job's limit is 90). Any change to a kernel source turns this off.
LEGACY_STAMP = "5e296aadd6ed07bf66597b46bc56c6dce8432d606fa205c398e07b7f8441c0ef"
_LEGACY_SOURCES = "a33ccdd978521ec36478eea9d3a0d4139106e8fc29d2357fb1589e4ea3b4e4e1"


@functools.cache
def _legacy_sources_unchanged() -> bool:
    h = hashlib.sha256()
    for d in _KERNEL_DIRS:
        for p in sorted(d.glob("*.py")):
            if p.resolve() != Path(__file__).resolve():
                h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest() == _LEGACY_SOURCES


_numba_load_index = IndexDataCacheFile._load_index


def _load_index_taking_legacy(self: IndexDataCacheFile) -> dict:
    """IndexDataCacheFile._load_index, which also takes an index stamped LEGACY_STAMP while the
    kernel sources are the legacy ones, and saves it again under this module's stamp."""
    overloads = _numba_load_index(self)
    if overloads or not _legacy_sources_unchanged():
        return overloads
    legacy = copy.copy(self)  # the same index file, read as numba reads it, under the old stamp
    legacy._source_stamp = LEGACY_STAMP
    old = _numba_load_index(legacy)
    if old:
        self._save_index(old)  # atomic (a rename); a save racing it at worst loses its new entry
    return old


IndexDataCacheFile._load_index = _load_index_taking_legacy  # type: ignore[method-assign]


class SourceTreeCacheLocator(UserProvidedCacheLocator):
    """numba's cache of this package's kernels under NUMBA_CACHE_DIR/edge_infer/<folder>, valid
    while the sources of the kernel's module and of every module it imports are byte-identical
    (source_stamp), wherever the checkout lies and whatever its files' times (numba's own locator keys the folder by the source's absolute
    path, so a fresh clone elsewhere never hits). Enabled by NUMBA_CACHE_LOCATOR_CLASSES =
    CACHE_LOCATORS with NUMBA_CACHE_DIR set (.ci/run does; tests/kernels_cpu/test_portable.py
    for its targets); files outside the kernel folders fall through to numba's locators."""

    def __init__(self, py_func: Any, py_file: str) -> None:
        super().__init__(py_func, py_file)
        self._module = py_func.__module__
        self._cache_path = os.path.join(config.CACHE_DIR, "edge_infer", Path(py_file).resolve().parent.name)  # type: ignore[attr-defined]

    def get_source_stamp(self) -> str:
        return source_stamp(self._module)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> SourceTreeCacheLocator | None:
        if Path(py_file).resolve().parent not in _KERNEL_DIRS:
            return None
        return super().from_function(py_func, py_file)


@dataclass(frozen=True, slots=True)
class JitCacheStatus:
    """location: the cache folder of this package's kernels (None when numba has none);
    writable: whether numba can save there; kernels: compiled-for-this-CPU / all, per module
    ({"attention": (5, 5), ...}); error: why the index could not be read, else None."""

    location: str | None
    writable: bool
    kernels: dict[str, tuple[int, int]]
    error: str | None = None

    @property
    def compiled(self) -> int:
        return sum(c for c, _ in self.kernels.values())

    @property
    def total(self) -> int:
        return sum(t for _, t in self.kernels.values())

    @property
    def state(self) -> str:
        """"warm" (every kernel cached for this CPU), "partly warm", "cold" or "unknown"."""
        if self.error is not None or not self.total:
            return "unknown"
        return "warm" if self.compiled == self.total else "cold" if not self.compiled else "partly warm"


def _dispatchers(module: Any) -> list[Any]:
    """The module's own cached, not-always-inlined numba functions (an inlined helper is
    compiled into its callers and never has a cache entry of its own)."""
    from numba.core.registry import CPUDispatcher

    out = []
    for obj in vars(module).values():
        if not isinstance(obj, CPUDispatcher) or obj.py_func.__module__ != module.__name__:
            continue
        if obj.targetoptions.get("inline") == "always" or not hasattr(obj._cache, "_cache_file"):  # type: ignore[attr-defined]
            continue  # inlined, or not cached (numba's NullCache)
        out.append(obj)
    return out


def _cached_for_this_target(d: Any) -> bool:
    """Whether d's index file has an entry for this CPU and d's current bytecode."""
    cache = d._cache
    want = cache._index_key(None, d.targetctx.codegen())[1:]
    return any(key[1:] == want for key in cache._cache_file._load_index())


def jit_cache_status() -> JitCacheStatus:
    """The cache's location and, per kernel module, how many of its kernels are compiled for
    this CPU (imports the kernel modules: about a second, compiles nothing)."""
    kernels: dict[str, tuple[int, int]] = {}
    location: str | None = None
    try:
        for name in KERNEL_MODULES:
            found = _dispatchers(importlib.import_module(f"{_PACKAGE}.{name}"))
            kernels[name] = (sum(_cached_for_this_target(d) for d in found), len(found))
            if location is None and found and hasattr(found[0]._cache, "_cache_path"):
                location = str(found[0]._cache._cache_path)
    except Exception as e:  # numba's private cache API changed: say so, guess nothing
        return JitCacheStatus(location, False, kernels, f"{type(e).__name__}: {e}")
    writable = location is not None and os.access(location if os.path.isdir(location) else
                                                  os.path.dirname(location), os.W_OK)
    return JitCacheStatus(location, writable, kernels)


class _FirstCompile(event.Listener):
    """A numba event listener that calls `callback(qualname)` once, at the first kernel of this
    package that is compiled (not loaded from the cache) after it was installed."""

    def __init__(self, callback: Callable[[str], None]) -> None:
        self.callback = callback
        self.fired = False
        self.lock = threading.Lock()

    def on_start(self, ev: Any) -> None:
        if self.fired:
            return
        d = (ev.data or {}).get("dispatcher")
        module = getattr(getattr(d, "py_func", None), "__module__", "") or ""
        if d is None or not module.startswith(_PACKAGE + "."):
            return
        with self.lock:
            if self.fired:
                return
            self.fired = True
        self.callback(f"{module.rsplit('.', 1)[-1]}.{d.py_func.__qualname__}")

    def on_end(self, ev: Any) -> None:
        pass


def on_first_compile(callback: Callable[[str], None]) -> Callable[[], None]:
    """Call `callback(kernel name)` once, when this process first compiles one of the package's
    kernels (a cache miss: a first run, a new CPU or a new version); returns a function that
    removes the hook. numba compiles on whichever thread calls the kernel first."""
    listener = _FirstCompile(callback)
    event.register("numba:compile", listener)

    def remove() -> None:
        try:
            event.unregister("numba:compile", listener)
        except ValueError:  # already removed
            pass

    return remove
