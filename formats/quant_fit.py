"""Importance-weighted block fits for the quantizer (`edge-infer quantize --calibrate`): the
compiled form of quantizers_weighted.py's `fit_symmetric` and `fit_affine`, which are their
NumPy twins (same candidates, same order, float64 sums; the tests compare them).

Each row of x is one block or sub-block; rows are independent and split over threads.

Compiled with numba as kernels_cpu's kernels are (cached, no GIL, NumPy's error model: a
division by zero gives inf/NaN rather than raising), but formats/ sits below kernels_cpu/ and
does not use its decorator; no fastmath, so the float results do not depend on how LLVM
vectorizes.
"""

from __future__ import annotations

import numba
import numpy as np

from edge_infer import numba_codegen  # noqa: F401  (its settings before the first numba function)


def _njit(fn=None, *, parallel: bool = False, inline: bool = False):  # type: ignore[no-untyped-def]
    """`@njit(cache=True, nogil=True, error_model="numpy")`; inline=True inlines the function
    into its callers at numba's level (small helpers in hot loops)."""

    def wrap(f):  # type: ignore[no-untyped-def]
        return numba.njit(cache=True, nogil=True, parallel=parallel, error_model="numpy",
                          inline="always" if inline else "never")(f)

    return wrap(fn) if fn is not None else wrap


@_njit(inline=True)
def _sym_try(x, w, r, inv, nmax, L):  # type: ignore[no-untyped-def]
    """Codes of row r for inverse scale inv into L; -> (d, gain) of the weighted LSQ scale."""
    n = x.shape[1]
    slx = 0.0
    sl2 = 0.0
    for i in range(n):
        q = min(max(np.rint(x[r, i] * inv), -nmax), nmax - 1)
        L[i] = np.int32(q)
        slx += w[r, i] * x[r, i] * q
        sl2 += w[r, i] * q * q
    if sl2 > 0:
        d = np.float32(slx / sl2)
        return d, slx * d
    return np.float32(0.0), 0.0


@_njit(parallel=True)
def fit_symmetric_kernel(x, w, nmax, steps, d_out, L_out, n_threads):  # type: ignore[no-untyped-def]
    """x, w f32 [m, n] -> d_out f32 [m], L_out i32 [m, n] in [-nmax, nmax - 1]: x ~ d * L."""
    m, n = x.shape
    per = (m + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        L = np.empty(n, np.int32)
        for r in range(tid * per, min(m, (tid + 1) * per)):
            _fit_symmetric_row(x, w, r, nmax, steps, L, d_out, L_out)


@_njit(inline=True)
def _fit_symmetric_row(x, w, r, nmax, steps, L, d_out, L_out):  # type: ignore[no-untyped-def]
    n = x.shape[1]
    mx = np.float32(0.0)
    amax = np.float32(-1.0)
    for i in range(n):
        if abs(x[r, i]) > amax:
            amax = abs(x[r, i])
            mx = x[r, i]
    if mx == 0:
        d_out[r] = 0
        for i in range(n):
            L_out[r, i] = 0
        return
    best_d = np.float32(0.0)
    best_gain = -1.0
    for k in range(2 * steps + 3):
        if k <= 2 * steps:
            inv = np.float32(-(nmax + 0.1 * (k - steps))) / mx
        else:  # codes for the fitted scale, twice
            inv = np.float32(1.0) / best_d if best_d != 0 else np.float32(0.0)
        d, gain = _sym_try(x, w, r, inv, nmax, L)
        if gain > best_gain:
            best_d, best_gain = d, gain
            for i in range(n):
                L_out[r, i] = L[i]
    d_out[r] = best_d


@_njit(inline=True)
def _affine_try(x, w, r, a, b, sw, sx, sxx, nmax, L):  # type: ignore[no-untyped-def]
    """Codes L = clamp(rint((x + b) * a)) of row r; -> (d, m, error) of the weighted LSQ fit
    x ~ d L - m with m >= 0 (error 1e300: no fit). sw, sx, sxx: the row's sums of w, w x, w x^2."""
    n = x.shape[1]
    sl = sl2 = sxl = 0.0
    for i in range(n):
        q = min(max(np.rint((x[r, i] + b) * a), np.float32(0.0)), np.float32(nmax))
        L[i] = np.int32(q)
        wq = np.float64(w[r, i]) * q
        sl += wq
        sl2 += wq * q
        sxl += wq * x[r, i]
    D = sw * sl2 - sl * sl
    if D > 0:
        d = (sw * sxl - sx * sl) / D
        m = (sl * sxl - sl2 * sx) / D
        if m < 0:  # the min would be above zero: pin it there and refit the scale alone
            d, m = sxl / sl2, 0.0
    elif sl2 > 0:
        d, m = sxl / sl2, 0.0
    else:
        return np.float32(0.0), np.float32(0.0), 1e300
    # sum w (d L - m - x)^2 from the sums
    err = d * d * sl2 + m * m * sw + sxx - 2 * d * m * sl - 2 * d * sxl + 2 * m * sx
    return np.float32(d), np.float32(m), err


@_njit(parallel=True)
def fit_affine_kernel(x, w, nmax, nstep, d_out, m_out, L_out, n_threads):  # type: ignore[no-untyped-def]
    """x, w f32 [m, n] -> d_out, m_out f32 [m] (m >= 0), L_out i32 [m, n] in [0, nmax]:
    x ~ d * L - m."""
    rows, n = x.shape
    per = (rows + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        L = np.empty(n, np.int32)
        for r in range(tid * per, min(rows, (tid + 1) * per)):
            _fit_affine_row(x, w, r, nmax, nstep, L, d_out, m_out, L_out)


@_njit(inline=True)
def _fit_affine_row(x, w, r, nmax, nstep, L, d_out, m_out, L_out):  # type: ignore[no-untyped-def]
    n = x.shape[1]
    lo = np.float32(0.0)
    hi = x[r, 0]
    sw = sx = sxx = 0.0
    for i in range(n):
        lo = min(lo, x[r, i])
        hi = max(hi, x[r, i])
        wi = np.float64(w[r, i])
        sw += wi
        sx += wi * x[r, i]
        sxx += wi * x[r, i] * x[r, i]
    rng = hi - lo
    if rng <= 0:
        d_out[r] = 0
        m_out[r] = -lo
        for i in range(n):
            L_out[r, i] = 0
        return
    d0 = np.float32(rng / nmax)
    bd, bm, berr = np.float32(0.0), np.float32(-lo), 1e300
    for k in range(-1, nstep + 3):
        if k < 0:  # the plain range fit
            a, b = np.float32(1.0) / d0, -lo
        elif k <= nstep:
            a, b = np.float32(nmax - 0.9 + 0.05 * k) / rng, -lo
        else:  # codes for the best fit so far, twice
            a, b = np.float32(1.0) / (bd if bd > 0 else d0), bm
        d, m, err = _affine_try(x, w, r, a, b, sw, sx, sxx, nmax, L)
        if err < berr:
            bd, bm, berr = d, m, err
            for i in range(n):
                L_out[r, i] = L[i]
    d_out[r] = bd
    m_out[r] = bm
