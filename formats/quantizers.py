"""Reference block quantizers, float32 blocks (n, block_size) -> bytes (n, type_size), bit-exact
with ggml's `quantize_row_*_ref` (no importance matrix) and with gguf-py where it has one
(the IQ2/IQ3 grid types: quantizers_grid.py, with ggml's `quantize_iq*` under an importance
matrix too).
Layouts are drawn in weight_types.py. Input must be finite; quants.quantize calls these under
np.errstate(all="ignore"): all-zero blocks divide by zero in lanes whose results are dropped.

K-quants search each sub-block for the best scale (and min) with float sums taken left to right.
Here all sub-blocks run at once as columns of (elements per sub-block, rows) arrays, and each
sum is an explicit loop over elements: NumPy's pairwise `sum` rounds differently.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
from gguf import GGMLQuantizationType as T

from edge_infer.formats.kpack import pack_k_scales, pack_q2_k, pack_q3_k, pack_q4_k, pack_q5_k, pack_q6_k
from edge_infer.formats.kscales import k4_scale_min
from edge_infer.formats.quant_round import GROUP_MAX_EPS, first_absmax, nearest_int, seq_sum
from edge_infer.formats.quantizers_grid import GRID_QUANTIZED, quantize_grid
from edge_infer.formats.quantizers_iq1 import IQ1_QUANTIZERS
from edge_infer.formats.quantizers_iq4 import quantize_iq4_nl, quantize_iq4_xs

__all__ = ["GRID_QUANTIZERS", "QUANTIZERS"]

F32 = np.float32


# -- F32, F16, BF16 and the 32-element types (gguf-py's and ggml's code agree on these) -------
def _round_away(v: np.ndarray) -> np.ndarray:
    """C roundf (half away from zero), exactly: `v - trunc(v)` is exact in float32."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= 0.5, np.sign(v), F32(0))


def _inv(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, F32(1) / d, F32(0))


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """Per row, the first value of largest magnitude (sign kept), as gguf-py picks it. (The C
    loop starts from +0, so a block of only -0.0 gets d = -0 there and +0 here.)"""
    return np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) u8 codes -> (n, 16) u8: element j in the low nibble, j+16 in the high one."""
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _q_sym(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    # C: d = max / -nmax; q = MIN(2*nmax - 1, (int8)(x*id + nmax + 0.5))
    d = _signed_absmax(x) / F32(-nmax)
    q = np.trunc(x * _inv(d) + F32(nmax + 0.5)).astype(np.uint8)
    return d, np.minimum(q, 2 * nmax - 1)


def _q_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # C: d = (max - min) / nmax; q = MIN(nmax, (int)((x - min)*id + 0.5))
    mn = x.min(axis=1, keepdims=True)
    d = (x.max(axis=1, keepdims=True) - mn) / F32(nmax)
    q = np.trunc((x - mn) * _inv(d) + F32(0.5)).astype(np.uint8)
    return d, mn, np.minimum(q, nmax)


def _qh(q: np.ndarray) -> np.ndarray:
    return np.packbits(q >> 4, axis=1, bitorder="little")


def _q_q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _q_sym(x, 8)
    return np.hstack([_f16_bytes(d), _pack_nibbles(q)])


def _q_q4_1(x: np.ndarray) -> np.ndarray:
    d, mn, q = _q_affine(x, 15)
    return np.hstack([_f16_bytes(d), _f16_bytes(mn), _pack_nibbles(q)])


def _q_q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _q_sym(x, 16)
    return np.hstack([_f16_bytes(d), _qh(q), _pack_nibbles(q)])


def _q_q5_1(x: np.ndarray) -> np.ndarray:
    d, mn, q = _q_affine(x, 31)
    return np.hstack([_f16_bytes(d), _f16_bytes(mn), _qh(q), _pack_nibbles(q)])


def _q_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / F32(127)
    q = _round_away(x * _inv(d)).astype(np.int8)
    return np.hstack([_f16_bytes(d), q.view(np.uint8)])


def _q_f32(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint8)


def _q_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8)


def _q_bf16(x: np.ndarray) -> np.ndarray:
    u = x.view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    # round to nearest even; NaN keeps its top bits and is made quiet
    r = ((u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    r = np.where(nan, ((u >> 16) | 64).astype(np.uint16), r)
    return r.view(np.uint8)


# -- K-quants --------------------------------------------------------------------------------
def _pos_max(s: np.ndarray) -> np.ndarray:
    """Row max of (blocks, k), floored at 0 and skipping NaN, as `if (v > m) m = v` from m = 0."""
    return np.where(s > 0, s, F32(0)).max(axis=1, keepdims=True)


def _f16_round(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 -> f16 bits (as stored) and back to f32 (as the C code reads it again)."""
    h = np.asarray(v, F32).astype(np.float16)
    return h, h.astype(F32)


def _make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric search with weights x*x (ggml make_qx_quants, rmse_type 1).
    x: (n, rows) -> (scale (rows,), L (n, rows) int32 in [0, 2*nmax))."""
    mx = first_absmax(x, 0)
    w = x * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lv = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = lv.astype(F32)
        return lv + nmax, seq_sum(w * x * lf), seq_sum(w * lf * lf)

    L, sumlx, suml2 = fit(F32(-nmax) / mx)
    scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        Lt, slx, sl2 = fit(-(F32(nmax) + F32(0.1) * F32(step)) / mx)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(better, Lt, L)
        scale = np.where(better, slx / sl2, scale)
        best = np.where(better, scale * slx, best)
    zero = np.abs(mx) < GROUP_MAX_EPS
    return np.where(zero, F32(0), scale), np.where(zero, 0, L)


def _make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric fit refined one quant at a time (ggml make_q3_quants, do_rmse).
    x: (n, rows) -> (scale (rows,), L (n, rows) int32 in [0, 2*nmax))."""
    mx = first_absmax(x, 0)
    w = x * x
    L = np.clip(nearest_int((F32(-nmax) / mx) * x), -nmax, nmax - 1)
    lf = L.astype(F32)
    sumlx, suml2 = seq_sum(w * x * lf), seq_sum(w * lf * lf)
    # A row that changed nothing in a pass would change nothing in the next one either, so
    # running every row for all 5 passes equals the C loop's early exit.
    for _ in range(5):
        for i in range(len(x)):
            wi, xi, li = w[i], x[i], L[i].astype(F32)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            new = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
            nf = new.astype(F32)
            slx2 = slx + wi * xi * nf
            sl22 = sl2 + wi * nf * nf
            take = (slx > 0) & (new != L[i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[i] = np.where(take, new, L[i])
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
    zero = np.abs(mx) < GROUP_MAX_EPS
    scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    return np.where(zero, F32(0), scale), np.where(zero, 0, L + nmax)


def _make_qkx2_quants(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted affine search (ggml make_qkx2_quants). x, w: (n, rows) ->
    (scale (rows,), L (n, rows) int32 in [0, nmax], the_min (rows,), to be subtracted)."""
    mn0 = np.minimum(x.min(axis=0), F32(0))
    mx = x.max(axis=0)
    sum_w = seq_sum(w)
    sum_x = seq_sum(w * x)

    def quant(iscale: np.ndarray, mn: np.ndarray) -> np.ndarray:
        return np.clip(nearest_int(iscale * (x - mn)), 0, nmax)

    def error(scale: np.ndarray, mn: np.ndarray, lf: np.ndarray) -> np.ndarray:
        diff = scale * lf + mn - x
        return seq_sum(w * (np.abs(diff) if use_mad else diff * diff))

    iscale = F32(nmax) / (mx - mn0)
    scale, mn = F32(1) / iscale, mn0
    L = quant(iscale, mn)
    best = error(scale, mn, L.astype(F32))
    for step in range(nstep + 1):
        # the C code steps from the best min found so far, not from the data's min
        La = quant((F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / (mx - mn), mn)
        lf = La.astype(F32)
        wl = w * lf
        sum_l, sum_l2, sum_xl = seq_sum(wl), seq_sum(wl * lf), seq_sum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min = np.where(pos, F32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        cur = error(this_scale, this_min, lf)
        better = (D > 0) & (cur < best)
        L = np.where(better, La, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    flat = mx == mn0  # C returns before the search: all quants 0, scale 0
    return np.where(flat, F32(0), scale), np.where(flat, 0, L), np.where(flat, -mn0, -mn)


def _requant(
    x: np.ndarray, L: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int, offset: int = 0
) -> np.ndarray:
    """Quants again against the stored (rounded) scales: L = clamp(round((x + dm) / d)) + offset;
    sub-blocks whose scale rounded to 0 keep their search result. x, L: (n, rows); d, dm: (rows,)."""
    Ln = np.clip(nearest_int((x if dm is None else x + dm) / d), lo, hi) + offset
    return np.where(d == 0, L, Ln)


def _cols(x: np.ndarray, sub: int) -> np.ndarray:
    """(blocks, 256) -> (sub, blocks * 256/sub): one sub-block per column."""
    return np.ascontiguousarray(x.reshape(-1, sub).T)


def _rows(L: np.ndarray, nb: int) -> np.ndarray:
    """Inverse of _cols for quants -> (blocks, 256) uint8."""
    return L.T.reshape(nb, -1).astype(np.uint8)


def _q_q8_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    mx = first_absmax(x, 1)
    zero = mx == 0
    iscale = F32(-127) / np.where(zero, F32(1), mx)
    q = np.minimum(nearest_int(iscale[:, None] * x), 127).astype(np.int8)
    q[zero] = 0
    d = np.where(zero, F32(0), F32(1) / iscale).astype("<f4")
    bsums = q.reshape(nb, 16, 16).sum(axis=2, dtype=np.int32).astype("<i2")
    return np.hstack([d.reshape(-1, 1).view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)])


def _q_q6_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    xs = _cols(x, 16)
    scales, L = _make_qx_quants(xs, 32)
    scales = scales.reshape(nb, 16)
    max_scale = first_absmax(scales, 1)[:, None]
    zero = (np.abs(max_scale) < GROUP_MAX_EPS)[:, 0]
    iscale = F32(-128) / np.where(zero[:, None], F32(1), max_scale)
    dh, d = _f16_round(F32(1) / iscale)
    sc = np.minimum(127, nearest_int(iscale * scales)).astype(np.int8)
    L = _rows(_requant(xs, L, (d * sc.astype(F32)).reshape(-1), None, -32, 31, 32), nb)
    out = pack_q6_k(sc, L, dh)
    out[zero] = 0
    return out


def _k_scales(scales: np.ndarray, mins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 8 float scales and mins per block -> 12 packed bytes, d and dmin (f16)."""
    max_scale, max_min = _pos_max(scales), _pos_max(mins)
    inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
    inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(nearest_int(inv_scale * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min * mins) & 0xFF, 63).astype(np.uint8)
    return pack_k_scales(ls, lm), (max_scale / F32(63)).astype(np.float16), (max_min / F32(63)).astype(np.float16)


def _q_k45(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, ...]:
    """Shared by Q4_K and Q5_K: -> (d, dmin (blocks, 1) f16, scales (blocks, 12) u8, L (blocks, 256) u8)."""
    nb = len(x)
    xs = _cols(x, 32)
    av_x = np.sqrt(seq_sum(xs * xs) / F32(32))
    scales, L, mins = _make_qkx2_quants(xs, av_x + np.abs(xs), nmax, rmin, 0.1, nstep, False)
    packed, dh, mh = _k_scales(scales.reshape(nb, 8), mins.reshape(nb, 8))
    sc, m = k4_scale_min(packed)
    d = (dh.astype(F32) * sc.astype(F32)).reshape(-1)
    dm = (mh.astype(F32) * m.astype(F32)).reshape(-1)
    return dh, mh, packed, _rows(_requant(xs, L, d, dm, 0, nmax), nb)


def _q_q4_k(x: np.ndarray) -> np.ndarray:
    return pack_q4_k(*_q_k45(x, 15, -1.0, 20))


def _q_q5_k(x: np.ndarray) -> np.ndarray:
    return pack_q5_k(*_q_k45(x, 31, -0.5, 15))


def _q_q2_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    xs = _cols(x, 16)
    scales, L, mins = _make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(nb, 16), mins.reshape(nb, 16)
    max_scale, max_min = _pos_max(scales), _pos_max(mins)
    has_s, has_m = max_scale > 0, max_min > 0
    lo = np.where(has_s, nearest_int((F32(15) / max_scale) * scales), 0) & 0xFF
    hi = np.where(has_m, nearest_int((F32(15) / max_min) * mins) << 4, 0) & 0xFF
    packed = (lo | hi).astype(np.uint8)
    dh = np.where(has_s, max_scale / F32(15), F32(0)).astype(np.float16)
    mh = np.where(has_m, max_min / F32(15), F32(0)).astype(np.float16)
    d = (dh.astype(F32) * (packed & 0x0F).astype(F32)).reshape(-1)
    dm = (mh.astype(F32) * (packed >> 4).astype(F32)).reshape(-1)
    return pack_q2_k(packed, _rows(_requant(xs, L, d, dm, 0, 3), nb), dh, mh)


def _q_q3_k(x: np.ndarray) -> np.ndarray:
    nb = len(x)
    xs = _cols(x, 16)
    scales, L = _make_q3_quants(xs, 4)
    scales = scales.reshape(nb, 16)
    max_scale = first_absmax(scales, 1)[:, None]
    has = max_scale != 0
    iscale = F32(-32) / np.where(has, max_scale, F32(1))
    ls = ((nearest_int(iscale * scales) + 128) & 0xFF) - 128  # the C code stores it in an int8 first
    ls = np.where(has, np.clip(ls, -32, 31) + 32, 0).astype(np.uint8)  # (nb, 16), 6 bits each
    dh, d = _f16_round(np.where(has, F32(1) / iscale, F32(0)))
    dl = (d * (ls.astype(F32) - F32(32))).reshape(-1)
    dl = np.where(has.repeat(16, axis=1).reshape(-1), dl, F32(0))
    return pack_q3_k(ls, _rows(_requant(xs, L, dl, None, -4, 3, 4), nb), dh)


# the types whose weight_types record says `quantizer` (tests/formats/test_weight_types.py checks)
QUANTIZERS: dict[T, Callable[[np.ndarray], np.ndarray]] = {
    T.F32: _q_f32,
    T.F16: _q_f16,
    T.BF16: _q_bf16,
    T.Q4_0: _q_q4_0,
    T.Q4_1: _q_q4_1,
    T.Q5_0: _q_q5_0,
    T.Q5_1: _q_q5_1,
    T.Q8_0: _q_q8_0,
    T.Q2_K: _q_q2_k,
    T.Q3_K: _q_q3_k,
    T.Q4_K: _q_q4_k,
    T.Q5_K: _q_q5_k,
    T.Q6_K: _q_q6_k,
    T.Q8_K: _q_q8_k,
    T.IQ4_NL: quantize_iq4_nl,
    T.IQ4_XS: quantize_iq4_xs,
}
# the grid types: (blocks (n, 256), importance=(n, 256) or None) -> blocks, ggml's own search
# under the importance as it is (IQ2_XXS / IQ2_XS / IQ1_S refuse None: they need one)
GRID_QUANTIZERS: dict[T, Callable[..., np.ndarray]] = {
    **{t: partial(quantize_grid, t=t) for t in GRID_QUANTIZED},
    **IQ1_QUANTIZERS,
}
QUANTIZERS.update(GRID_QUANTIZERS)
