"""Counts numpy's array-data allocations: a numpy memory handler (NEP 49) whose malloc, calloc
and realloc count and forward to libc, installed through numpy's C API with ctypes. Views
allocate no data and are not counted; numba's own scratch inside kernels does not go through
numpy and is not counted either."""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_libc = ctypes.CDLL(None)
_libc.malloc.restype = _libc.calloc.restype = _libc.realloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
_libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_REALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Allocator(ctypes.Structure):  # PyDataMemAllocator (numpy/ndarraytypes.h)
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", _MALLOC), ("calloc", _CALLOC),
                ("realloc", _REALLOC), ("free", _FREE)]


class _Handler(ctypes.Structure):  # PyDataMem_Handler
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("allocator", _Allocator)]


COUNT = [0]  # allocations made while the handler is installed


def _malloc(ctx: int, size: int) -> int:
    COUNT[0] += 1
    return _libc.malloc(size)


def _calloc(ctx: int, n: int, size: int) -> int:
    COUNT[0] += 1
    return _libc.calloc(n, size)


def _realloc(ctx: int, ptr: int, size: int) -> int:
    COUNT[0] += 1
    return _libc.realloc(ptr, size)


def _free(ctx: int, ptr: int, size: int) -> None:
    _libc.free(ptr)


# kept alive for the process: arrays made under the handler free through it later
_CALLBACKS = (_MALLOC(_malloc), _CALLOC(_calloc), _REALLOC(_realloc), _FREE(_free))
_HANDLER = _Handler(b"edge_infer_test_counting", 1, _Allocator(None, *_CALLBACKS))
_NAME = ctypes.create_string_buffer(b"mem_handler")  # the capsule keeps a pointer to its name
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_CAPSULE = _capsule_new(ctypes.addressof(_HANDLER), ctypes.addressof(_NAME), None)


def _set_handler() -> ctypes._CFuncPtr:
    """numpy's PyDataMem_SetHandler, found through its C-API table (the index is read from the
    header numpy ships, so it follows numpy's version)."""
    header = Path(np.get_include()) / "numpy" / "__multiarray_api.h"
    index = int(re.search(r"#define PyDataMem_SetHandler \\\s*\(.*?\)\s*\\?\s*PyArray_API\[(\d+)\]", header.read_text(),
                          re.S).group(1))
    try:
        from numpy._core import _multiarray_umath as mu
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath as mu  # type: ignore[no-redef]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    table = ctypes.cast(get(mu._ARRAY_API, None), ctypes.POINTER(ctypes.c_void_p))
    return ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(table[index])


@contextlib.contextmanager
def counting_allocations() -> Iterator[list[int]]:
    """Within the block, numpy data allocations of this thread's context are counted in the
    yielded one-element list."""
    set_handler = _set_handler()
    COUNT[0] = 0
    old = set_handler(_CAPSULE)
    box = [0]
    try:
        yield box
    finally:
        box[0] = COUNT[0]
        set_handler(old)
