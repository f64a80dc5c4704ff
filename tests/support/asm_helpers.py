"""Assembly of kernels compiled afresh, for the code-generation tests (tests/kernels_cpu/test_asm*.py).

numba's inspect_asm has nothing for code loaded from the on-disk cache, so each function is
compiled again from its Python source, with the flags of its kernel decorator."""

from __future__ import annotations

import numba

from edge_infer.kernels_cpu._jit import NoAliasCompiler


def asm_of(dispatcher, sig: tuple) -> str:  # type: ignore[no-untyped-def]
    """Assembly of a kernel compiled afresh (no cache) the way its decorator compiles it (its
    fastmath flags and reference counting included)."""
    fastmath = dispatcher.targetoptions.get("fastmath", False)
    nrt = dispatcher.targetoptions.get("_nrt", True)  # kernel(refcount=False) compiles without it
    fn = numba.njit(nogil=True, error_model="numpy", fastmath=fastmath, _nrt=nrt, pipeline_class=NoAliasCompiler)(
        dispatcher.py_func
    )
    fn.compile(sig)
    return fn.inspect_asm(sig)
