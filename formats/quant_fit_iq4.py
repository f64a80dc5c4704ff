"""The compiled form of quantizers_iq4.py's per-block search (`block_scales`, the codes for a
scale), which is its NumPy twin: the same float32 operations in the same order, so the same
bits (tests/formats/test_quants.py compares both with ggml). Blocks are independent and split
over threads; no fastmath (no reassociation, no fused multiply-adds: ggml's C does neither).
"""

from __future__ import annotations

import numba
import numpy as np

from edge_infer import numba_codegen  # noqa: F401  (its settings before the first numba function)
from edge_infer.formats.weight_types import IQ4_TABLE

VALUES = np.array(IQ4_TABLE, np.float32)
_EPS = np.float32(1e-15)  # quant_round.GROUP_MAX_EPS


def _jit(parallel: bool = False):  # type: ignore[no-untyped-def]
    return numba.njit(cache=True, nogil=True, error_model="numpy", parallel=parallel)


@_jit()
def best_index(v):  # type: ignore[no-untyped-def]
    """ggml's best_index_int8 over the table for one float32 v."""
    if v <= VALUES[0]:
        return 0
    if v >= VALUES[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if v < VALUES[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if v - VALUES[mu - 1] < VALUES[mu] - v else mu


@_jit()
def _sums(x, w, b, inv):  # type: ignore[no-untyped-def]
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for j in range(32):
        q = VALUES[best_index(inv * x[b, j])]
        sumqx += w[b, j] * q * x[b, j]
        sumq2 += w[b, j] * q * q
    return sumqx, sumq2


@_jit(parallel=True)
def block_scales_kernel(x, w, tries, d_out):  # type: ignore[no-untyped-def]
    """x, w float32 [n, 32] -> d_out float32 [n]: each block's fitted scale (quantizers_iq4)."""
    for b in numba.prange(x.shape[0]):
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(32):
            ax = abs(x[b, j])
            if ax > amax:
                amax = ax
                mx = x[b, j]
        if amax < _EPS:
            d_out[b] = np.float32(0.0)
            continue
        sumqx, sumq2 = _sums(x, w, b, np.float32(1.0) / (-mx / VALUES[0]))
        d = sumqx / sumq2 if sumq2 > 0 else np.float32(0.0)
        best = d * sumqx
        for t in range(-tries, tries + 1):
            sumqx, sumq2 = _sums(x, w, b, np.float32(t - 127) / mx)
            if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                d = sumqx / sumq2
                best = d * sumqx
        d_out[b] = d


@_jit(parallel=True)
def codes_kernel(x, inv, codes):  # type: ignore[no-untyped-def]
    """codes[b, j] = best_index(inv[b] * x[b, j]) (uint8 [n, 32])."""
    for b in numba.prange(x.shape[0]):
        for j in range(32):
            codes[b, j] = best_index(inv[b] * x[b, j])
