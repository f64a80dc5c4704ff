"""Assembly of kernels compiled afresh, for the code-generation tests (tests/kernels_cpu/test_asm*.py).

numba's inspect_asm has nothing for code loaded from the on-disk cache, so each function is
compiled again from its Python source, with the flags of its kernel decorator. That took about
110 s of each CI run for the same listings run after run, so a listing is kept under
<edge-infer cache>/asm, named by a digest of everything its compilation reads: the source stamp
of the kernel's module (kernels_cpu/jit_cache.py: the sources of every module of the package it
imports), this file, the signature and flags, the numba, llvmlite and Python versions, and the
host CPU's name and features with numba's target settings. Any change to those compiles afresh."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import llvmlite
import numba
from llvmlite import binding as llvm
from numba.core import config

from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.hub import cache_dir
from edge_infer.kernels_cpu._jit import NoAliasCompiler
from edge_infer.kernels_cpu.jit_cache import source_stamp


def _listing_key(dispatcher, sig: tuple, fastmath: object, nrt: bool) -> str:  # type: ignore[no-untyped-def]
    """Digest of every input of the compilation asm_of runs."""
    fn = dispatcher.py_func
    parts = (
        source_stamp(fn.__module__), Path(__file__).read_text(), fn.__module__, fn.__qualname__, repr(sig),
        repr(sorted(fastmath) if isinstance(fastmath, set | frozenset) else fastmath),  # a set's order varies
        repr(nrt), numba.__version__, llvmlite.__version__, sys.version,
        llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
        repr((config.CPU_NAME, config.CPU_FEATURES, config.OPT)),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _compile_asm(dispatcher, sig: tuple, fastmath: object, nrt: bool) -> str:  # type: ignore[no-untyped-def]
    fn = numba.njit(nogil=True, error_model="numpy", fastmath=fastmath, _nrt=nrt, pipeline_class=NoAliasCompiler)(
        dispatcher.py_func
    )
    fn.compile(sig)
    return fn.inspect_asm(sig)


def asm_of(dispatcher, sig: tuple) -> str:  # type: ignore[no-untyped-def]
    """Assembly of a kernel compiled afresh (no numba cache) the way its decorator compiles it
    (its fastmath flags and reference counting included); a listing compiled before from the
    same inputs is read back instead."""
    fastmath = dispatcher.targetoptions.get("fastmath", False)
    nrt = dispatcher.targetoptions.get("_nrt", True)  # kernel(refcount=False) compiles without it
    if not dispatcher.py_func.__module__.startswith("edge_infer."):  # no source stamp outside the package
        return _compile_asm(dispatcher, sig, fastmath, nrt)
    folder = cache_dir() / "asm"
    path = folder / f"{_listing_key(dispatcher, sig, fastmath, nrt)}.s"
    if path.exists():
        return path.read_text()
    asm = _compile_asm(dispatcher, sig, fastmath, nrt)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)  # renamed into place: never read half-written
    tmp.write_text(asm)
    commit(tmp, path)
    return asm
