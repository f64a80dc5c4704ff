"""The compiled search of the IQ2/IQ3 grid quantizers (quantizers_grid.py): per 256-value
super-block, each block's scale, codebook entries and signs, the same float32 operations in the
same order as ggml's `quantize_row_iq2_xxs_impl` ... `quantize_row_iq3_s_impl`, so the same
bytes (tests/formats/test_quantizers_grid.py compares them with ggml's).

Per block of 16 or 32 values: weights (the importance times sqrt(sigma2 + x^2), or x^2-based
without one), magnitudes |x| (the grid types with 7 stored sign bits make the number of minus
signs per 8 even by flipping the least important one), then `n_try` trial scales each side of
the block maximum; per trial every group of `width` magnitudes is rounded to the lattice and,
off the codebook, replaced by its best neighbour under the weights (grid_lattice.py); the trial
with the best weighted fit wins, its groups are re-rounded at the fitted scale and the scale
refitted once more. Super-blocks are independent and split over threads; no fastmath (ggml's C
neither reassociates nor fuses these sums).

P (int32 [8]) and E (float32 [2]): quantizers_grid.GridSearch's integer and float fields, in
order (block, levels, step x 10, trials, parity, refine, sigma, weights; zero_below, d_factor).
"""

from __future__ import annotations

import numba
import numpy as np

from edge_infer.formats.quant_fit import _njit

F = np.float32
_FLT_MAX = np.float32(3.4028234663852886e38)


@_njit(inline=True)
def _best_near(u, xv, wa, o, width, scale, levels, odd, near_start, near_count, near, L):  # type: ignore[no-untyped-def]
    """The neighbour of lattice point u nearest xv[o : o + width] / scale under weights wa
    (odd: the entries' values 2l + 1 as float32); its levels into L[o : o + width]; -> its
    codebook index."""
    best_d2 = _FLT_MAX
    best = near[near_start[u]]  # where every distance overflows (ggml aborts there)
    for j in range(near_count[u]):
        g = near[near_start[u] + j]
        d2 = F(0.0)
        for i in range(width):
            diff = scale * odd[g, i] - xv[o + i]
            d2 += wa[o + i] * diff * diff
        if d2 < best_d2:
            best_d2 = d2
            best = g
    for i in range(width):
        L[o + i] = levels[best, i]
    return best


@_njit(inline=True)
def _round_group(xv, wa, o, width, bits, kmax, inv, scale, levels, odd, code_of, near_start, near_count, near, L):  # type: ignore[no-untyped-def]
    """Levels of group xv[o : o + width] at inverse scale inv into L, moved onto the codebook;
    -> whether the rounded point already was on it."""
    u = 0
    for i in range(width):
        v = np.rint(F(0.5) * (inv * xv[o + i] - F(1.0)))
        q = 0 if v < 0 else (kmax - 1 if v > kmax - 1 else int(v))
        L[o + i] = q
        u |= q << (bits * i)
    if code_of[u] >= 0:
        return True
    _best_near(u, xv, wa, o, width, scale, levels, odd, near_start, near_count, near, L)
    return False


@_njit(inline=True)
def _fit_sums(xv, w, L, n):  # type: ignore[no-untyped-def]
    sumqx = F(0.0)
    sumq2 = F(0.0)
    for i in range(n):
        q = F(2 * L[i] + 1)
        sumqx += w[i] * xv[i] * q
        sumq2 += w[i] * q * q
    return sumqx, sumq2


@_njit
def _qp_scale(xv, w, n, nmax, Lq):  # type: ignore[no-untyped-def]
    """ggml's make_qp_quants(n, nmax, x, L, w): the scale of a fit x ~ scale * L, L in 0..nmax
    (stored as uint8, as in C: a negative code wraps)."""
    mx = F(0.0)
    for i in range(n):
        if xv[i] > mx:
            mx = xv[i]
    if mx < F(1e-15):
        return F(0.0)
    iscale = F(nmax) / mx
    for i in range(n):
        Lq[i] = int(np.rint(iscale * xv[i])) & 255
    scale = F(1.0) / iscale
    best_mse = F(0.0)
    for i in range(n):
        diff = xv[i] - scale * F(Lq[i])
        best_mse += w[i] * diff * diff
    for s in range(-4, 5):
        if s == 0:
            continue
        iscale_s = (F(0.1) * F(s) + F(nmax)) / mx
        scale_s = F(1.0) / iscale_s
        mse = F(0.0)
        for i in range(n):
            diff = xv[i] - scale_s * F(min(nmax, int(np.rint(iscale_s * xv[i]))))
            mse += w[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_s
    sumlx = F(0.0)
    suml2 = F(0.0)
    for i in range(n):
        q = min(nmax, int(np.rint(iscale * xv[i])))
        Lq[i] = q & 255
        sumlx += w[i] * xv[i] * F(q)
        suml2 += w[i] * F(q) * F(q)
    for _ in range(5):
        changed = 0
        for i in range(n):
            slx = sumlx - w[i] * xv[i] * F(Lq[i])
            sl2 = suml2 - w[i] * F(Lq[i]) * F(Lq[i])
            if slx > 0 and sl2 > 0:
                q = min(nmax, int(np.rint(xv[i] * sl2 / slx)))
                if q != Lq[i]:
                    slx += w[i] * xv[i] * F(q)
                    sl2 += w[i] * F(q) * F(q)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        Lq[i] = q & 255
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return sumlx / suml2 if suml2 > F(0.0) else F(0.0)


@_njit
def _block_magnitudes(xb, o, n, weight, parity, xv, signs, s0):  # type: ignore[no-untyped-def]
    """|x| of block xb[o : o + n] into xv and its sign bytes into signs[s0 :]; with parity, the
    least important value of an 8 with an odd number of minus signs keeps its sign."""
    for k in range(n // 8):
        s = 0
        nflip = 0
        for i in range(8):
            v = xb[o + 8 * k + i]
            if v >= 0:
                xv[8 * k + i] = v
            else:
                xv[8 * k + i] = -v
                nflip += 1
                s |= 1 << i
        if parity and nflip % 2 == 1:
            imin = 0
            vmin = weight[8 * k] * xb[o + 8 * k] * xb[o + 8 * k]
            for i in range(1, 8):
                a = weight[8 * k + i] * xb[o + 8 * k + i] * xb[o + 8 * k + i]
                if a < vmin:
                    vmin = a
                    imin = i
            xv[8 * k + imin] = -xv[8 * k + imin]
            s ^= 1 << imin
        signs[s0 + k] = s & 127 if parity else s


@_njit
def _fit_block(xv, w, wa, n, width, bits, P, mx, lat, L, Laux, on, on_aux, Lq):  # type: ignore[no-untyped-def]
    """The scale of one block's magnitudes xv[:n] (max mx > 0); its levels into L.
    -> (whether the block is kept, its scale)."""
    kmax, step, n_try, refine = P[1], F(P[2]) / F(10.0), P[3], P[5]
    levels, odd, code_of, near_start, near_count, near = lat
    groups = n // width
    if n_try == 0:  # IQ2_XXS: trials around a make_qp_quants fit
        scale = _qp_scale(xv, w, n, kmax + 1, Lq)
        for i in range(n):
            L[i] = Lq[i]
        top = scale * F(kmax)
        if top <= 0:
            return False, F(0.0)
        n_try = 6
    else:
        scale = mx / F(2 * kmax - 1)
        top = mx
        for i in range(n):
            L[i] = 0
    for k in range(groups):
        on[k] = refine != 2
    best = F(0.0)
    for t in range(-n_try, n_try + 1):
        inv = (F(2 * kmax - 1) + F(t) * step) / top
        for k in range(groups):
            on_aux[k] = _round_group(xv, wa, width * k, width, bits, kmax, inv, F(1.0) / inv, levels, odd, code_of,
                                     near_start, near_count, near, Laux)
        sumqx, sumq2 = _fit_sums(xv, w, Laux, n)
        if sumq2 > 0 and sumqx * sumqx > best * sumq2:
            scale = sumqx / sumq2
            best = scale * sumqx
            for i in range(n):
                L[i] = Laux[i]
            for k in range(groups):
                on[k] = on_aux[k]
    n_off = 0
    for k in range(groups):
        n_off += not on[k]
    if scale > 0 and (refine == 0 or n_off > 0):
        inv = F(1.0) / scale
        for k in range(groups):
            if refine != 1 or not on[k]:
                _round_group(xv, wa, width * k, width, bits, kmax, inv, scale, levels, odd, code_of, near_start,
                             near_count, near, L)
        sumqx, sumq2 = _fit_sums(xv, w, L, n)
        if sumq2 > 0:
            scale = sumqx / sumq2
    return True, scale


@_njit(parallel=True)
def fit_grid_kernel(x, qw, lat, P, E, idx, signs, lcode, d, bad):  # type: ignore[no-untyped-def]
    """x f32 [m, 256] super-blocks, qw f32 [m, 256] their importance (or [0, 256]: none), lat
    the lattice's arrays (levels, levels' odd values 2l + 1 as f32, code_of, near_start,
    near_count, near: grid_lattice.GridLattice) -> idx i32 [m, 256 / width] codebook entries, signs u8 [m, 32] (bit i of byte k: value 8k + i
    negative), lcode u8 [m, 256 / block] 4-bit block scales, d f32 [m] (the f16 d before
    rounding), bad u8 [m] (1: a level pattern off the codebook, a bug)."""
    levels, code_of = lat[0], lat[2]
    width = levels.shape[1]
    bits = 2 if width == 8 else 3
    n, parity, sig, wkind = P[0], P[4] == 1, F(P[6]), P[7]
    eps, d_factor = E[0], E[1]
    for b in numba.prange(x.shape[0]):
        xb = x[b]
        weight = np.empty(n, F)
        wa = np.empty(n, F)
        xv = np.empty(n, F)
        L = np.zeros(n, np.int32)
        Laux = np.zeros(n, np.int32)
        Lq = np.zeros(n, np.int32)
        on = np.zeros(n // width, np.bool_)
        on_aux = np.zeros(n // width, np.bool_)
        scales = np.zeros(256 // n, F)
        sumx2 = F(0.0)
        for i in range(256):
            sumx2 += xb[i] * xb[i]
        sigma2 = sig * sumx2 / F(256.0)
        max_scale = F(0.0)
        for i in range(idx.shape[1]):
            idx[b, i] = 0
        for i in range(32):
            signs[b, i] = 0
        for ib in range(256 // n):
            o = n * ib
            for i in range(n):
                v = xb[o + i]
                if qw.shape[0] > 0:
                    weight[i] = qw[b, o + i] * np.sqrt(sigma2 + v * v)
                elif wkind == 2:
                    weight[i] = F(0.25) * sigma2 + v * v
                else:
                    weight[i] = v * v
                wa[i] = np.sqrt(weight[i])
            s0 = o // 8
            _block_magnitudes(xb, o, n, weight, parity, xv, signs[b], s0)
            mx = xv[0]
            for i in range(1, n):
                mx = mx if mx > xv[i] else xv[i]
            kept, scale = False, F(0.0)
            if not (mx < eps or mx == 0):
                kept, scale = _fit_block(xv, weight, wa, n, width, bits, P, mx, lat, L, Laux, on, on_aux, Lq)
            if not kept:  # an all-zero block: the codebook's entry 0, no signs, scale code 0
                for k in range(n // 8):
                    signs[b, s0 + k] = 0
                continue
            if scale < 0:  # never expected; the signs flip with the scale, as ggml does
                scale = -scale
                for k in range(n // 8):
                    signs[b, s0 + k] = ~signs[b, s0 + k] & (127 if parity else 255)
            for k in range(n // width):
                u = 0
                for i in range(width):
                    u |= L[width * k + i] << (bits * i)
                g = code_of[u]
                if g < 0:
                    bad[b] = 1
                    g = 0
                idx[b, o // width + k] = g
            scales[ib] = scale
            max_scale = max_scale if max_scale > scale else scale
        if max_scale == 0:
            d[b] = F(0.0)
            for i in range(idx.shape[1]):
                idx[b, i] = 0
            for i in range(32):
                signs[b, i] = 0
            for ib in range(256 // n):
                lcode[b, ib] = 0
            continue
        dd = max_scale / F(31.0)
        inv = F(1.0) / dd
        for ib in range(256 // n):
            v = np.rint(F(0.5) * (inv * scales[ib] - F(1.0)))
            lcode[b, ib] = 0 if v < 0 else (15 if v > 15 else int(v))
        d[b] = dd * d_factor
