"""Importance-weighted quantizers: the block scales (and mins) that minimise the weighted squared
error sum_i w_i (x_i - x'_i)^2 of a row, where w comes from an importance matrix (the mean
square of each input channel's activation over calibration text, as llama.cpp's imatrix).

A weight's error reaches the layer's output scaled by its input channel's activation, so
E[|dy|^2] = sum_j dW_j^2 E[a_j^2]: channels that carry large activations need small errors.
As in llama.cpp the per-element weight is importance_j * sqrt(sigma2 + x_j^2) (sigma2: the
row's mean square), which also favours the block's large weights.

Each fit searches a few candidate inverse scales around the block's range, solves the weighted
least-squares scale (and min) for each one's codes, keeps the best, then alternates codes and
scale twice more. K-quants fit every 16- or 32-element sub-block, then quantize the sub-block
scales themselves with the same weighted search (weights: each sub-block's summed weight) and
round the codes once more against the stored scales. Output bytes have the layouts of
weight_types.py; the reference (unweighted) quantizers are in quantizers.py. `fit_symmetric` and
`fit_affine` here are the NumPy twins of the compiled fits the quantizers run
(quant_fit.py).

Shapes: x (m, n) float32 rows of sub-blocks or blocks; w the same; codes int32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from edge_infer.formats.kpack import pack_k_scales, pack_q2_k, pack_q3_k, pack_q4_k, pack_q5_k, pack_q6_k
from edge_infer.formats.quantizers_iq4 import quantize_iq4_nl, quantize_iq4_xs

__all__ = ["WEIGHTED_QUANTIZERS", "element_weights"]

F32 = np.float32
Fit = tuple[np.ndarray, np.ndarray]


def element_weights(x: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """x (rows, n), importance (n,) -> the per-element weights (rows, n)."""
    sigma2 = (x.astype(np.float64) ** 2).mean(axis=1, keepdims=True)
    return (importance[None, :] * np.sqrt(sigma2 + x.astype(np.float64) ** 2)).astype(F32)


def _lsq(x: np.ndarray, w: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least-squares scale for codes L (x ~ d * L) and its error reduction."""
    lf = L.astype(np.float64)
    slx = (w * x * lf).sum(axis=1)
    sl2 = (w * lf * lf).sum(axis=1)
    ok = sl2 > 0
    d = np.where(ok, slx / np.where(ok, sl2, 1), 0).astype(F32)
    return d, np.where(ok, slx * d, 0)


def fit_symmetric(x: np.ndarray, w: np.ndarray, nmax: int, steps: int = 9) -> Fit:
    """x ~ d * L with L in [-nmax, nmax - 1] (the largest magnitude maps to -nmax).
    -> (d (m,), L (m, n))."""
    amax = np.abs(x).argmax(axis=1)
    mx = x[np.arange(len(x)), amax]
    safe = np.where(mx != 0, mx, F32(1))
    best_d = np.zeros(len(x), F32)
    best_gain = np.full(len(x), -1.0, F32)
    best_L = np.zeros(x.shape, np.int32)
    for s in range(-steps, steps + 1):
        L = np.clip(np.rint(x * (-(nmax + 0.1 * s) / safe)[:, None]), -nmax, nmax - 1).astype(np.int32)
        d, gain = _lsq(x, w, L)
        better = gain > best_gain
        best_d, best_gain = np.where(better, d, best_d), np.where(better, gain, best_gain)
        best_L[better] = L[better]
    for _ in range(2):  # codes for the fitted scale, then the scale for those codes
        inv = np.where(best_d != 0, 1 / np.where(best_d != 0, best_d, 1), 0)
        L = np.clip(np.rint(x * inv[:, None]), -nmax, nmax - 1).astype(np.int32)
        d, gain = _lsq(x, w, L)
        better = gain > best_gain
        best_d, best_gain = np.where(better, d, best_d), np.where(better, gain, best_gain)
        best_L[better] = L[better]
    zero = mx == 0
    best_d[zero], best_L[zero] = 0, 0
    return best_d, best_L


def _affine_lsq(x: np.ndarray, w: np.ndarray, L: np.ndarray, sums: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted least squares x ~ d * L - m with m >= 0 -> (d, m, error); sums: the rows'
    sums of w, w x and w x^2 (float64)."""
    sw, sx, sxx = sums
    lf = L.astype(np.float64)
    wq = w * lf
    sl, sl2, sxl = wq.sum(1), (wq * lf).sum(1), (wq * x).sum(1)
    D = sw * sl2 - sl * sl
    okD = D > 0
    Ds = np.where(okD, D, 1)
    alone = np.where(sl2 > 0, sxl / np.where(sl2 > 0, sl2, 1), 0)
    d = np.where(okD, (sw * sxl - sx * sl) / Ds, alone)
    m = np.where(okD, (sl * sxl - sl2 * sx) / Ds, 0)
    neg = m < 0  # the min would be above zero: pin it there and refit the scale alone
    d, m = np.where(neg, alone, d), np.where(neg, 0, m)
    err = d * d * sl2 + m * m * sw + sxx - 2 * d * m * sl - 2 * d * sxl + 2 * m * sx
    return d.astype(F32), m.astype(F32), np.where(okD | (sl2 > 0), err, 1e300)


def fit_affine(x: np.ndarray, w: np.ndarray, nmax: int, nstep: int = 36) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x ~ d * L - m with L in [0, nmax], m >= 0. -> (d (m,), m (m,), L (m, n))."""
    lo = np.minimum(x.min(axis=1), 0)
    rng = x.max(axis=1) - lo
    flat = rng <= 0
    rng = np.where(flat, F32(1), rng)
    wd = w.astype(np.float64)
    sums = (wd.sum(1), (wd * x).sum(1), (wd * x * x).sum(1))
    d0 = (rng / nmax).astype(F32)
    bd, bm, berr = np.zeros(len(x), F32), (-lo).astype(F32), np.full(len(x), 1e300)
    bL = np.zeros(x.shape, np.int32)
    for k in range(-1, nstep + 3):
        if k < 0:  # the plain range fit
            a, b = F32(1) / d0, -lo
        elif k <= nstep:
            a, b = F32(nmax - 0.9 + 0.05 * k) / rng, -lo
        else:  # codes for the best fit so far, twice
            a, b = F32(1) / np.where(bd > 0, bd, d0), bm
        L = np.clip(np.rint((x + b[:, None]) * a[:, None]), 0, nmax).astype(np.int32)
        d, m, err = _affine_lsq(x, w, L, sums)
        better = err < berr
        bd, bm, berr = np.where(better, d, bd), np.where(better, m, bm), np.where(better, err, berr)
        bL[better] = L[better]
    bd[flat], bL[flat] = 0, 0
    return bd, bm, bL


def fit_positive(v: np.ndarray, w: np.ndarray, nmax: int) -> Fit:
    """Non-negative v (m, k) ~ s * c with codes c in [0, nmax] (a super-block's sub-block
    scales or mins). -> (s (m,), c (m, k))."""
    mx = v.max(axis=1)
    safe = np.where(mx > 0, mx, F32(1))
    best_s, best_err = np.zeros(len(v), F32), np.full(len(v), np.inf)
    best_c = np.zeros(v.shape, np.int32)
    for s in range(-4, 5):
        c = np.clip(np.rint(v * ((nmax + 0.1 * s) / safe)[:, None]), 0, nmax).astype(np.int32)
        sc, _ = _lsq(v, w, c)
        err = (w * (v - sc[:, None] * c) ** 2).sum(axis=1)
        better = err < best_err
        best_s, best_err = np.where(better, sc, best_s), np.where(better, err, best_err)
        best_c[better] = c[better]
    zero = mx <= 0
    best_s[zero], best_c[zero] = 0, 0
    return best_s, best_c


def _sym(x: np.ndarray, w: np.ndarray, nmax: int) -> Fit:
    """fit_symmetric, compiled (quant_fit.py)."""
    from edge_infer.formats.quant_fit import fit_symmetric_kernel

    d, L = np.empty(len(x), F32), np.empty(x.shape, np.int32)
    fit_symmetric_kernel(np.ascontiguousarray(x, F32), np.ascontiguousarray(w, F32), nmax, 9, d, L, _threads())
    return d, L


def _aff(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fit_affine, compiled (quant_fit.py)."""
    from edge_infer.formats.quant_fit import fit_affine_kernel

    d, m, L = np.empty(len(x), F32), np.empty(len(x), F32), np.empty(x.shape, np.int32)
    fit_affine_kernel(np.ascontiguousarray(x, F32), np.ascontiguousarray(w, F32), nmax, 36, d, m, L, _threads())
    return d, m, L


def _threads() -> int:
    import numba

    return int(numba.get_num_threads())


def _f16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(v, F32).astype(np.float16)
    return h.reshape(-1, 1), h.astype(F32).reshape(-1)


def _codes(x: np.ndarray, d: np.ndarray, m: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """Codes again against the stored scales: clamp(round((x + m) / d)); d == 0 gives lo."""
    inv = np.where(d != 0, 1 / np.where(d != 0, d, 1), 0)
    y = x if m is None else x + m[:, None]
    return np.clip(np.rint(y * inv[:, None]), lo, hi).astype(np.int32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    return ((q[:, :16] & 0x0F) | (q[:, 16:] << 4)).astype(np.uint8)


def _qh(q: np.ndarray) -> np.ndarray:
    return np.packbits((q >> 4).astype(np.uint8), axis=1, bitorder="little")


def _q_sym32(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    d, _ = _sym(x, w, nmax)
    dh, df = _f16(d)
    return dh, (_codes(x, df, None, -nmax, nmax - 1) + nmax).astype(np.uint8)


def _q_aff32(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, m, _ = _aff(x, w, nmax)
    dh, df = _f16(d)
    mh, mf = _f16(-m)  # stored as the block's minimum: x ~ d * q + min
    return dh, mh, _codes(x, df, -mf, 0, nmax).astype(np.uint8)


def _q4_0(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, q = _q_sym32(x, w, 8)
    return np.hstack([dh.view(np.uint8), _pack_nibbles(q)])


def _q5_0(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, q = _q_sym32(x, w, 16)
    return np.hstack([dh.view(np.uint8), _qh(q), _pack_nibbles(q)])


def _q4_1(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, mh, q = _q_aff32(x, w, 15)
    return np.hstack([dh.view(np.uint8), mh.view(np.uint8), _pack_nibbles(q)])


def _q5_1(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, mh, q = _q_aff32(x, w, 31)
    return np.hstack([dh.view(np.uint8), mh.view(np.uint8), _qh(q), _pack_nibbles(q)])


def _sub(x: np.ndarray, size: int) -> np.ndarray:
    return x.reshape(-1, size)


def _affine_k(x: np.ndarray, w: np.ndarray, sub: int, nmax: int, smax: int) -> tuple[np.ndarray, ...]:
    """Q2_K/Q4_K/Q5_K: affine sub-blocks, their scales and mins coded in [0, smax] against
    one f16 scale each per super-block. -> (dh, mh, scale codes, min codes, L (nb, 256))."""
    nb, per = len(x), 256 // sub
    xs, ws = _sub(x, sub), _sub(w, sub)
    d, m, _ = _aff(xs, ws, nmax)
    sw = ws.sum(axis=1).reshape(nb, per)
    ds, ls = fit_positive(d.reshape(nb, per), sw, smax)
    dm, lm = fit_positive(m.reshape(nb, per), sw, smax)
    dh, dsf = _f16(ds)
    mh, dmf = _f16(dm)
    d_eff = (dsf[:, None] * ls).reshape(-1).astype(F32)
    m_eff = (dmf[:, None] * lm).reshape(-1).astype(F32)
    L = _codes(xs, d_eff, m_eff, 0, nmax).reshape(nb, 256).astype(np.uint8)
    return dh, mh, ls.astype(np.uint8), lm.astype(np.uint8), L


def _symmetric_k(x: np.ndarray, w: np.ndarray, nmax: int, smax: int) -> tuple[np.ndarray, ...]:
    """Q3_K/Q6_K: symmetric 16-element sub-blocks, their signed scales coded in
    [-smax, smax - 1] against one f16 scale per super-block. -> (dh, scale codes, L + nmax)."""
    nb = len(x)
    xs, ws = _sub(x, 16), _sub(w, 16)
    d, _ = _sym(xs, ws, nmax)
    sw = ws.sum(axis=1).reshape(nb, 16)
    ds, ls = _sym(d.reshape(nb, 16), sw, smax)
    dh, dsf = _f16(ds)
    d_eff = (dsf[:, None] * ls).reshape(-1).astype(F32)
    L = _codes(xs, d_eff, None, -nmax, nmax - 1).reshape(nb, 256) + nmax
    return dh, ls, L.astype(np.uint8)


def _q2_k(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, mh, ls, lm, L = _affine_k(x, w, 16, 3, 15)
    return pack_q2_k((ls | (lm << 4)).astype(np.uint8), L, dh, mh)


def _q4_k(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, mh, ls, lm, L = _affine_k(x, w, 32, 15, 63)
    return pack_q4_k(dh, mh, pack_k_scales(ls, lm), L)


def _q5_k(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, mh, ls, lm, L = _affine_k(x, w, 32, 31, 63)
    return pack_q5_k(dh, mh, pack_k_scales(ls, lm), L)


def _q3_k(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, ls, L = _symmetric_k(x, w, 4, 32)
    return pack_q3_k((ls + 32).astype(np.uint8), L, dh)


def _q6_k(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    dh, ls, L = _symmetric_k(x, w, 32, 128)
    return pack_q6_k(ls.astype(np.int8), L, dh)


# qtype -> fn(blocks (nb, block_size) f32, weights (nb, block_size) f32) -> (nb, type_size) u8.
# Q8_0 and the float types have no weighted form: their error is already below what an
# importance matrix can steer (llama.cpp ignores it for them too).
# the types whose weight_types record says `weighted` (tests/formats/test_weight_types.py checks)
WEIGHTED_QUANTIZERS: dict[T, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q2_K: _q2_k,
    T.Q3_K: _q3_k,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
    # llama.cpp's own search, under these element weights (quantizers_iq4)
    T.IQ4_NL: quantize_iq4_nl,
    T.IQ4_XS: quantize_iq4_xs,
}
