"""numba's cache of the kernels: each kernel module's stamp covers exactly what its kernels can
reach (so a change to one kernel family recompiles only the modules that import it), an index of
the legacy stamp is taken only while the kernel sources are the legacy ones, and cache saves
from processes sharing a folder cannot cross their entries (edge_infer/numba_cache.py).
"""

from __future__ import annotations

import ast
import importlib
import pickle
import pkgutil
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from numba.core.caching import IndexDataCacheFile
from numba.core.registry import CPUDispatcher

from edge_infer import formats, kernels_cpu, numba_cache
from edge_infer.kernels_cpu import jit_cache

OURS = ("edge_infer.kernels_cpu", "edge_infer.formats")


def _names(code: types.CodeType) -> set[str]:
    """Global names a function's code (nested functions included) reads."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _module_names() -> list[str]:
    return [f"{pkg.__name__}.{m.name}" for pkg in (kernels_cpu, formats) for m in pkgutil.iter_modules(pkg.__path__)]


@pytest.mark.parametrize("module", _module_names())
def test_the_stamp_covers_every_function_and_module_a_kernel_reaches(module: str) -> None:
    mod = importlib.import_module(module)
    closure = set(jit_cache.import_closure(module))
    kernels = [v for v in vars(mod).values() if isinstance(v, CPUDispatcher) and v.py_func.__module__ == module]
    for d in kernels:
        for name in _names(d.py_func.__code__):
            value: Any = d.py_func.__globals__.get(name)
            owner = (value.__name__ if isinstance(value, types.ModuleType)
                     else value.py_func.__module__ if isinstance(value, CPUDispatcher)
                     else getattr(value, "__module__", None) if callable(value) else None)
            if owner and owner.startswith("edge_infer.") and owner != jit_cache.__name__:
                assert owner in closure, f"{module}.{d.py_func.__name__} reaches {owner}.{name}, outside its stamp"


def test_a_kernel_module_s_stamp_leaves_out_what_it_does_not_import() -> None:
    closure = jit_cache.import_closure("edge_infer.kernels_cpu.matmul_k")
    for inside in ("kernels_cpu.simd_k", "kernels_cpu._jit", "formats.weight_types", "numba_codegen"):
        assert f"edge_infer.{inside}" in closure, closure
    for outside in ("kernels_cpu.attention", "formats.quantizers", "kernels_cpu.jit_cache", "engine.runner"):
        assert f"edge_infer.{outside}" not in closure, closure
    stamps = {m: jit_cache.source_stamp(m) for m in ("edge_infer.kernels_cpu.matmul_k", "edge_infer.kernels_cpu.attention")}
    assert len(set(stamps.values())) == 2 and all(len(s) == 64 for s in stamps.values())


def test_the_import_lines_are_every_import_statement_of_every_module() -> None:
    """The stamp reads a module's imports from the lines that look like import statements: for
    every source of the package, the same statements a whole-file parse finds (in a function
    too), and a cut-short statement falls back to the whole parse."""
    import edge_infer

    def dump(nodes: list[ast.stmt]) -> list[str]:
        return sorted(ast.dump(n) for n in nodes)

    sources = [m.name for m in pkgutil.walk_packages(edge_infer.__path__, "edge_infer.")]
    assert len(sources) > 150
    for name in sources:
        path = jit_cache._source_file(name)
        if path:
            text = Path(path).read_text()
            whole = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import | ast.ImportFrom)]
            assert dump(jit_cache.import_statements(text)) == dump(whole), name
    tricky = "def f():\n    from a import (b,\n        c)\n    import d, \\\n        e\n"
    assert [type(n).__name__ for n in jit_cache.import_statements(tricky)] == ["ImportFrom", "Import"]


def test_two_processes_adding_signatures_at_once_keep_their_own_entries(tmp_path: Path) -> None:
    """Both writers read the empty index before either saves (a barrier inside the index read):
    numba's unlocked save gives both signatures one data file name, and the index that wins maps
    one signature to the other's code. Under the lock the second writer reads the index only
    after the first has saved, so the barrier times out and each keeps its own file."""
    files = [IndexDataCacheFile(str(tmp_path), "kernel-1.py312", "stamp") for _ in range(2)]
    both_read = threading.Barrier(2)
    original = IndexDataCacheFile._load_index

    def load_then_wait(self: IndexDataCacheFile) -> dict:
        index = original(self)
        try:
            both_read.wait(timeout=1.0)
        except threading.BrokenBarrierError:
            pass
        return index

    numba_cache.lock_cache_saves()
    errors: list[BaseException] = []

    def save(i: int) -> None:
        try:
            files[i].save(("sig", i), f"code for signature {i}")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(IndexDataCacheFile, "_load_index", load_then_wait)
        threads = [threading.Thread(target=save, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    reader = IndexDataCacheFile(str(tmp_path), "kernel-1.py312", "stamp")
    for i in range(2):
        assert reader.load(("sig", i)) == f"code for signature {i}"


def test_the_data_is_on_disk_before_the_index_names_it(tmp_path: Path) -> None:
    numba_cache.lock_cache_saves()
    cache = IndexDataCacheFile(str(tmp_path), "kernel-2.py312", "new stamp")
    # a stale data file of a previous source, under the name the first new entry gets
    stale = IndexDataCacheFile(str(tmp_path), "kernel-2.py312", "old stamp")
    stale.save(("old sig",), "stale code")
    seen: list[object] = []
    original = IndexDataCacheFile._save_index

    def check_then_save(self: IndexDataCacheFile, overloads: dict) -> None:
        seen.extend(self._load_data(name) for name in overloads.values())
        original(self, overloads)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(IndexDataCacheFile, "_save_index", check_then_save)
        cache.save(("new sig",), "new code")
    assert seen == ["new code"]
    assert cache.load(("new sig",)) == "new code"


@pytest.mark.parametrize("sources_unchanged", [True, False])
def test_a_legacy_index_is_taken_only_while_the_sources_are_the_legacy_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sources_unchanged: bool
) -> None:
    old = IndexDataCacheFile(str(tmp_path), "kernel-3.py312", jit_cache.LEGACY_STAMP)
    old.save(("sig",), "code compiled from the legacy sources")
    monkeypatch.setattr(jit_cache, "_legacy_sources_unchanged", lambda: sources_unchanged)
    new = IndexDataCacheFile(str(tmp_path), "kernel-3.py312", "a module's stamp")
    got = new.load(("sig",))
    with open(tmp_path / "kernel-3.py312.nbi", "rb") as f:
        pickle.load(f)
        stamp, _ = pickle.loads(f.read())
    if sources_unchanged:
        assert got == "code compiled from the legacy sources" and stamp == "a module's stamp"
    else:
        assert got is None and stamp == jit_cache.LEGACY_STAMP  # compiled again, as for any stale index
