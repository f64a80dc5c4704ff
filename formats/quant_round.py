"""The float32 steps ggml's C quantizers share, reproduced bit for bit in NumPy (quantizers.py,
quantizers_iq4.py): nearest_int, sums in element order, the first value of largest magnitude.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GROUP_MAX_EPS", "first_absmax", "nearest_int", "seq_sum"]

F32 = np.float32
_MAGIC = F32(12582912.0)  # 1.5 * 2**23: adding it leaves round-to-nearest-even of x in the low bits
GROUP_MAX_EPS = F32(1e-15)  # ggml's: a block whose largest magnitude is below it is all zero


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int, bit for bit (round half to even for |v| < 2**22), as int32."""
    return ((np.asarray(v, F32) + _MAGIC).view(np.int32) & 0x007FFFFF) - 0x00400000


def seq_sum(p: np.ndarray) -> np.ndarray:
    """(n, rows) -> (rows,): `s = 0; for i: s += p[i]`, in float32, in that order."""
    acc = np.zeros(p.shape[1:], F32)
    for row in p:
        acc += row
    return acc


def first_absmax(s: np.ndarray, axis: int) -> np.ndarray:
    """Along `axis`, the first value of largest magnitude, sign kept, as the C loop
    `if (fabsf(v) > amax) { amax = fabsf(v); max = v; }` from amax = max = 0 finds it
    (so NaN never wins, and an all-zero run gives +0)."""
    a = np.abs(s)
    a = np.where(np.isnan(a), F32(0), a)
    idx = np.expand_dims(a.argmax(axis=axis), axis)
    best = np.take_along_axis(s, idx, axis=axis)
    return np.where(np.take_along_axis(a, idx, axis=axis) > 0, best, F32(0)).squeeze(axis)
