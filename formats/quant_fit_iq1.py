"""The compiled search of the IQ1_S / IQ1_M quantizers (quantizers_iq1.py): per 256-value
super-block, each block's split of its values into the three levels -1, 0, 1 (shifted by
+-delta), the codebook entries nearest that split and the scales, the same float32 operations
in the same order as ggml's `quantize_row_iq1_s_impl` / `quantize_row_iq1_m_impl`, so the same
bytes (tests/formats/test_quantizers_grid.py).

Per block (32 values for IQ1_S, 16 for IQ1_M): the values sorted, and every pair of split
points tried exactly from prefix sums of w x and w (IQ1_S: one delta sign per block; IQ1_M:
one per half, four combinations); the best split's levels are moved onto the codebook (an
off-codebook group of 8 takes its nearest neighbour under the weights, grid_lattice.py) and the
scale refitted. Super-blocks are independent and split over threads; no fastmath.
"""

from __future__ import annotations

import numba
import numpy as np

from edge_infer.formats.quant_fit import _njit

F = np.float32
_FLT_MAX = np.float32(3.4028234663852886e38)
DELTA = np.float32(0.125)  # IQ1S_DELTA = IQ1M_DELTA
_X_P = np.array([F(-1) + DELTA, DELTA, F(1) + DELTA], F)  # the levels with the delta added
_X_M = np.array([F(-1) - DELTA, -DELTA, F(1) - DELTA], F)  # ... subtracted


@_njit(inline=True)
def _nearest2(u, xg, wg, scale, xx, levels, near_start, near_count, near, Lg):  # type: ignore[no-untyped-def]
    """ggml's iq1_find_best_neighbour2: the neighbour of lattice point u whose values xx[level]
    times scale are nearest the group's values xg[:8] under weights wg[:8]; its levels into
    Lg[:8]; -> its index."""
    best_d2 = _FLT_MAX
    best = near[near_start[u]]  # where every distance overflows (ggml aborts there)
    for j in range(near_count[u]):
        g = near[near_start[u] + j]
        d2 = F(0.0)
        for i in range(8):
            diff = scale * xx[levels[g, i]] - xg[i]
            d2 += wg[i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            best = g
    for i in range(8):
        Lg[i] = levels[best, i]
    return best


@_njit(inline=True)
def _on_codebook(xb, o, n, w, scale, xs, L, lat, idx):  # type: ignore[no-untyped-def]
    """Block xb[o : o + n]'s levels L onto the codebook, group k of 8 with values xs[k];
    entries into idx[0 : n / 8]; -> whether every group already was on it."""
    levels, code_of, near_start, near_count, near = lat
    all_on = True
    for k in range(n // 8):
        u = 0
        for j in range(8):
            u |= L[8 * k + j] << (2 * j)
        g = code_of[u]
        if g < 0:
            all_on = False
            g = _nearest2(u, xb[o + 8 * k :], w[8 * k :], scale, xs[k], levels, near_start, near_count, near,
                          L[8 * k :])
        idx[k] = g
    return all_on


@_njit(inline=True)
def _refit(xb, o, n, w, xs, idx, levels, scale):  # type: ignore[no-untyped-def]
    sumqx = F(0.0)
    sumq2 = F(0.0)
    for k in range(n // 8):
        for j in range(8):
            q = xs[k][levels[idx[k], j]]
            sumqx += w[8 * k + j] * q * xb[o + 8 * k + j]
            sumq2 += w[8 * k + j] * q * q
    return sumqx / sumq2 if sumqx > 0 and sumq2 > 0 else scale


@_njit(inline=True)
def _block_weights(xb, o, n, qw, b, sigma2, w):  # type: ignore[no-untyped-def]
    for i in range(n):
        v = xb[o + i]
        w[i] = qw[b, o + i] * np.sqrt(sigma2 + v * v) if qw.shape[0] > 0 else v * v
    mx = abs(xb[o])
    for i in range(1, n):
        a = abs(xb[o + i])
        mx = mx if mx > a else a
    return mx


@_njit(inline=True)
def _prefix(xb, o, n, w, order, px, pw, half):  # type: ignore[no-untyped-def]
    """Prefix sums over the sorted values of w x and w: px/pw [2, n + 1] per half (half: IQ1_M's
    two halves apart), else row 0 only."""
    px[0, 0] = px[1, 0] = F(0.0)
    pw[0, 0] = pw[1, 0] = F(0.0)
    for j in range(n):
        i = order[j]
        h = 1 if half and i >= n // 2 else 0
        px[h, j + 1] = px[h, j] + w[i] * xb[o + i]
        pw[h, j + 1] = pw[h, j] + w[i]
        px[1 - h, j + 1] = px[1 - h, j]
        pw[1 - h, j + 1] = pw[1 - h, j]


@_njit(inline=True)
def _start(xb, idx_b):  # type: ignore[no-untyped-def]
    """A super-block's sigma2 (2 / 256 of its sum of squares, summed in order); its entries zeroed."""
    sumx2 = F(0.0)
    for i in range(256):
        sumx2 += xb[i] * xb[i]
    for i in range(idx_b.shape[0]):
        idx_b[i] = 0
    return F(2.0) * sumx2 / F(256.0)


@_njit(inline=True)
def _levels_of_split(order, n, i1, i2, L):  # type: ignore[no-untyped-def]
    for j in range(n):
        L[order[j]] = 0 if j < i1 else (1 if j < i2 else 2)


@_njit(parallel=True)
def fit_iq1s_kernel(x, qw, lat, idx, lcode, d):  # type: ignore[no-untyped-def]
    """x f32 [m, 256] super-blocks, qw f32 [m, 256] their importance (or [0, 256]: x^2) ->
    idx i32 [m, 32] codebook entries, lcode u8 [m, 8] each 32's 3-bit scale | 8 for a minus
    delta, d f32 [m] (the f16 d before rounding)."""
    for b in numba.prange(x.shape[0]):
        xb = x[b]
        w = np.empty(32, F)
        px = np.zeros((2, 33), F)
        pw = np.zeros((2, 33), F)
        L = np.zeros(32, np.int64)
        bidx = np.zeros(4, np.int64)
        xs = np.empty((4, 3), F)
        scales = np.zeros(8, F)
        shifts = np.ones(8, np.int64)
        sigma2 = _start(xb, idx[b])
        max_scale = F(0.0)
        for ib in range(8):
            o = 32 * ib
            mx = _block_weights(xb, o, 32, qw, b, sigma2, w)
            if mx < F(1e-12):
                continue
            order = np.argsort(xb[o : o + 32], kind="mergesort")
            _prefix(xb, o, 32, w, order, px, pw, False)
            best, scale, i1b, i2b, shift = -_FLT_MAX, mx, -1, -1, 0
            for i1 in range(33):
                for i2 in range(i1, 33):
                    a, m, c = px[0, i1] - px[0, 0], px[0, i2] - px[0, i1], px[0, 32] - px[0, i2]
                    wa, wm, wc = pw[0, i1] - pw[0, 0], pw[0, i2] - pw[0, i1], pw[0, 32] - pw[0, i2]
                    for sgn in (1, -1):
                        v = _X_P if sgn == 1 else _X_M
                        sqx = a * v[0] + m * v[1] + c * v[2]
                        sq2 = wa * v[0] * v[0] + wm * v[1] * v[1] + wc * v[2] * v[2]
                        if sq2 > 0 and sqx * sqx > best * sq2:
                            scale = sqx / sq2
                            best = scale * sqx
                            i1b, i2b, shift = i1, i2, sgn
            if i1b < 0 or i2b < 0 or shift == 0:
                continue
            _levels_of_split(order, 32, i1b, i2b, L)
            if scale < 0:
                for j in range(32):
                    L[j] = 2 - L[j]
                scale, shift = -scale, -shift
            for k in range(4):
                xs[k] = _X_P if shift == 1 else _X_M
            if not _on_codebook(xb, o, 32, w, scale, xs, L, lat, bidx):
                scale = _refit(xb, o, 32, w, xs, bidx, lat[0], scale)
            for k in range(4):
                idx[b, 4 * ib + k] = bidx[k]
            scales[ib] = scale
            shifts[ib] = shift
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            d[b] = F(0.0)
            for ib in range(8):
                lcode[b, ib] = 0
            continue
        dd = max_scale / F(15.0)
        d[b] = dd * F(1.125)
        inv = F(1.0) / dd
        for ib in range(8):
            v = np.rint(F(0.5) * (inv * scales[ib] - F(1.0)))
            code = 0 if v < 0 else (7 if v > 7 else int(v))
            lcode[b, ib] = code | (8 if shifts[ib] == -1 else 0)


@_njit(parallel=True)
def fit_iq1m_kernel(x, qw, lat, idx, lcode, shifts, d):  # type: ignore[no-untyped-def]
    """x f32 [m, 256], qw as fit_iq1s_kernel -> idx i32 [m, 32], lcode u8 [m, 16] each 16's
    3-bit scale, shifts u8 [m, 16] (bit 0: the second 8's delta is minus, bit 1: the first's),
    d f32 [m] (the refitted d before rounding)."""
    for b in numba.prange(x.shape[0]):
        xb = x[b]
        w = np.empty(16, F)
        px = np.zeros((2, 17), F)
        pw = np.zeros((2, 17), F)
        L = np.zeros(16, np.int64)
        bidx = np.zeros(2, np.int64)
        xs = np.empty((2, 3), F)
        sqx = np.empty(4, F)
        sq2 = np.empty(4, F)
        scales = np.zeros(16, F)
        sigma2 = _start(xb, idx[b])
        max_scale = F(0.0)
        for ib in range(16):
            shifts[b, ib] = 0
            o = 16 * ib
            mx = _block_weights(xb, o, 16, qw, b, sigma2, w)
            if mx < F(1e-7):
                continue
            order = np.argsort(xb[o : o + 16], kind="mergesort")
            _prefix(xb, o, 16, w, order, px, pw, True)
            p2, m2 = _X_P[2], _X_M[2]
            cp1, cp2 = _X_P[0] * _X_P[0] - _X_P[1] * _X_P[1], _X_P[1] * _X_P[1] - _X_P[2] * _X_P[2]
            cm1, cm2 = _X_M[0] * _X_M[0] - _X_M[1] * _X_M[1], _X_M[1] * _X_M[1] - _X_M[2] * _X_M[2]
            best, scale, i1b, i2b, kb = -_FLT_MAX, mx, -1, -1, -1
            for i1 in range(17):
                for i2 in range(i1, 17):
                    s0, s1 = px[0, i1] + px[0, i2], px[1, i1] + px[1, i2]
                    qxp0, qxp1 = px[0, 16] * p2 - s0, px[1, 16] * p2 - s1
                    qxm0, qxm1 = px[0, 16] * m2 - s0, px[1, 16] * m2 - s1
                    q2p0 = pw[0, 16] * p2 * p2 + pw[0, i1] * cp1 + pw[0, i2] * cp2
                    q2p1 = pw[1, 16] * p2 * p2 + pw[1, i1] * cp1 + pw[1, i2] * cp2
                    q2m0 = pw[0, 16] * m2 * m2 + pw[0, i1] * cm1 + pw[0, i2] * cm2
                    q2m1 = pw[1, 16] * m2 * m2 + pw[1, i1] * cm1 + pw[1, i2] * cm2
                    sqx[0], sqx[1], sqx[2], sqx[3] = qxp0 + qxp1, qxp0 + qxm1, qxm0 + qxp1, qxm0 + qxm1
                    sq2[0], sq2[1], sq2[2], sq2[3] = q2p0 + q2p1, q2p0 + q2m1, q2m0 + q2p1, q2m0 + q2m1
                    for k in range(4):
                        if sq2[k] > 0 and sqx[k] * sqx[k] > best * sq2[k]:
                            scale = sqx[k] / sq2[k]
                            best = scale * sqx[k]
                            i1b, i2b, kb = i1, i2, k
            if i1b < 0 or i2b < 0 or kb < 0:
                continue
            _levels_of_split(order, 16, i1b, i2b, L)
            if scale < 0:
                for j in range(16):
                    L[j] = 2 - L[j]
                scale, kb = -scale, 3 - kb
            xs[0] = _X_P if kb < 2 else _X_M
            xs[1] = _X_P if kb % 2 == 0 else _X_M
            if not _on_codebook(xb, o, 16, w, scale, xs, L, lat, bidx):
                scale = _refit(xb, o, 16, w, xs, bidx, lat[0], scale)
            idx[b, 2 * ib] = bidx[0]
            idx[b, 2 * ib + 1] = bidx[1]
            scales[ib] = scale
            shifts[b, ib] = kb
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            d[b] = F(0.0)
            for ib in range(16):
                lcode[b, ib] = 0
                shifts[b, ib] = 0
            continue
        dd = max_scale / F(15.0)
        inv = F(1.0) / dd
        fx = F(0.0)
        f2 = F(0.0)
        for ib in range(16):
            v = np.rint(F(0.5) * (inv * scales[ib] - F(1.0)))
            code = 0 if v < 0 else (7 if v > 7 else int(v))
            lcode[b, ib] = code
            _block_weights(xb, 16 * ib, 16, qw, b, sigma2, w)
            for k in range(2):
                minus = shifts[b, ib] >= 2 if k == 0 else shifts[b, ib] % 2 == 1
                xx = _X_M if minus else _X_P
                g = idx[b, 2 * ib + k]
                for j in range(8):
                    q = xx[lat[0][g, j]] * F(2 * code + 1)
                    fx += w[8 * k + j] * q * xb[16 * ib + 8 * k + j]
                    f2 += w[8 * k + j] * q * q
        if f2 > 0:
            dd = fx / f2
        d[b] = dd * F(1.1125)
