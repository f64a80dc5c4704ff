"""Integer matmul: activations quantized to int8 per 32-block, u8 x s8 dot products (AVX-512
VNNI `vpdpbusd`, or plain vector IR that LLVM lowers anywhere; kernels_cpu.simd_i8), float
scales per (row, block).

Weights are repacked once at load (kernels_cpu.repack_i8) into a row-interleaved layout: per
group of 16 rows and 32-column block, 8 "quads", quad q holding columns 4q..4q+3 of the 16 rows
(row l at bytes 4l..4l+3), so one vpdpbusd adds 4 products into each of 16 row lanes and a block
needs no horizontal sums; block scales (and mins) stay f16, 16 per (group, block). Three byte
formats:
- 8-bit (Q8_0): 512 bytes per block, u8 = q + 128 (offset 128);
- 4-bit (Q4_0, Q4_1): 256 bytes per block, quads 0-3 in the low nibbles, 4-7 in the high ones
  (u8 = q, 0..15; offset 8 for Q4_0, a float min per (row, block) for Q4_1);
- 5-bit (Q5_0, Q5_1): the 4-bit bytes plus 64 bytes of fifth bits, one 64-bit mask per quad
  (u8 = q, 0..31; offset 16 for Q5_0, a float min for Q5_1);
- a table format (IQ4_NL): the 4-bit bytes, each code read through the type's 16 int8 values
  in registers into the 8-bit format's u8 = v + 128 (offset 128; v itself with
  simd_isa.SIGNED_EIGHT, on sdot and AVX2, offset 0).
Per row lane and block, with xq the token's int8 block, dx its scale:
    isum = sum(u8 * xq) - offset * sum(xq)                       (exact integers)
    acc += float(isum) * (d_w * dx) [+ m_w * (dx * sum(xq))]     (blocks in order)
The same per-lane arithmetic runs for every token whatever the batch, so GEMV and GEMM rows
are bit-identical (batch invariance) and the thread count changes nothing.
"""

from __future__ import annotations

import numba
import numpy as np

from ._jit import HAS_F16C, kernel, prefetch
from .simd_dot import FMT_IQ4, FMT_MXFP4
from .simd_i8 import (
    GROUP,
    block_scales,
    dot_tile,
    dot_tile4,
    scale_accumulate,
    scale_min_accumulate,
    store_tile,
)
from .simd_tile import PREFETCH_SCALES, i8_blocks_tile, i8_pair_tile

TOKEN_TILE = 4  # tokens that share each weight load in the GEMM path
# A GEMM walks the tokens in chunks of about this many activation bytes, all row groups per
# chunk: the chunk's int8 activations stay in L2 while the weights stream through, instead of
# every row group re-reading all the tokens' activations from L3 (qwen2.5-1.5B's 8960-wide
# ffn_down: 4.6 MB of activations for a 512-token prompt, re-read by each of 96 groups).
CHUNK_BYTES = 256 * 1024


@kernel(inline=True)
def token_chunk(k):
    """Tokens per chunk for K-wide int8 activations: a multiple of TOKEN_TILE, at least one tile."""
    return max(TOKEN_TILE, CHUNK_BYTES // k // TOKEN_TILE * TOKEN_TILE)


@kernel(inline=True)
def _quantize_row(x, t, xq, xd, xsum):
    per = x.shape[1] // xsum.shape[1]  # values per sum: 32 (the int8 kernel) or 16 (the K-quant one)
    for b in range(x.shape[1] // 32):
        amax = np.float32(0.0)
        for j in range(32):
            amax = max(amax, abs(x[t, b * 32 + j]))
        d = amax / np.float32(127.0)
        inv = np.float32(0.0) if d == 0 else np.float32(1.0) / d
        for h in range(32 // per):
            s = np.int32(0)
            for j in range(per):
                c = b * 32 + h * per + j
                v = np.int32(np.rint(x[t, c] * inv))
                xq[t, c] = np.int8(v)
                s += v
            xsum[t, b * (32 // per) + h] = s
        xd[t, b] = d


SERIAL_QUANTIZE_VALUES = 4096  # below this many activations a parallel launch costs more


@kernel(parallel=True)
def quantize_rows_q8(x, xq4, xd, xsum):
    """Per token and 32-block: d = max|x| / 127, q = rint(x / d) (int8, packed 4 per int32 in
    xq4 [T, K/4]), xd [T, K/32] = d, xsum [T, K/32] = sum of q (int32), or xsum [T, K/16]:
    the sums per 16 (the K-quant kernel's; codes and scales the same bits). (Rounding d to float16
    and scaling by 127 / max|x|, as llama.cpp does, was tried: it agreed less with llama.cpp's
    logits, not more, and moved ours further from exact math.)"""
    T, K = x.shape
    xq = xq4.view(np.int8).reshape(T, K)
    if T * K < SERIAL_QUANTIZE_VALUES:
        for t in range(T):
            _quantize_row(x, t, xq, xd, xsum)
    else:
        for t in numba.prange(T):
            _quantize_row(x, t, xq, xd, xsum)


@kernel(inline=True)
def _i8_tile(n, fmt, with_min, facc, w, wo, x4, xd, xs, wd, wm, so, nb, t, k4, corr):
    """All nb blocks of a group for the n tokens from t (3 padded to four by repeating the
    last) through simd_tile.i8_blocks_tile, its literal format and mins chosen here."""
    ta, tb, tc, td = t, t + min(1, n - 1), t + min(2, n - 1), t + min(3, n - 1)
    if n == 1:
        _i8_tile_fmt(fmt, with_min, facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, ta, ta, ta, k4, corr, 1)
    elif n == 2:  # a MoE step's expert with two pairs: no padded work
        _i8_tile_fmt(fmt, with_min, facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tb, tb, k4, corr, 2)
    else:
        _i8_tile_fmt(fmt, with_min, facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, 4)


@kernel(inline=True)
def _i8_tile_fmt(fmt, with_min, facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, ntok):
    if fmt == 8:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, False, 8, ntok)
    elif fmt == 4 and with_min:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, True, 4, ntok)
    elif fmt == 4:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, False, 4, ntok)
    elif fmt == 5 and with_min:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, True, 5, ntok)
    elif fmt == 5:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, False, 5, ntok)
    elif fmt == FMT_IQ4:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, False, FMT_IQ4, ntok)
    else:
        i8_blocks_tile(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, False, FMT_MXFP4, ntok)


@kernel(inline=True)
def _i8_pair_fmt(fmt, with_min, facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, t, k4, corr):
    """i8_pair_tile of the four tokens from t, its literal format and mins chosen here."""
    ta, tb, tc, td = t, t + 1, t + 2, t + 3
    if fmt == 8:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, False, 8, 4)
    elif fmt == 4 and with_min:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, True, 4, 4)
    elif fmt == 4:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, False, 4, 4)
    elif fmt == 5 and with_min:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, True, 5, 4)
    elif fmt == 5:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, False, 5, 4)
    elif fmt == FMT_IQ4:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, False, FMT_IQ4,
                     4)
    else:
        i8_pair_tile(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, False,
                     FMT_MXFP4, 4)


@kernel
def _i8_groups(xq4, xd, xsum, wi, wd, wm, w_offset, fmt, out, g0, g1, iacc, facc):
    """Row groups g0..g1-1 of one matrix for every token (see matmul_i8_kernel); iacc: int32
    [TOKEN_TILE * GROUP], facc: float32 [2 TOKEN_TILE, GROUP] (a pair's two groups) scratch of the
    calling thread."""
    T, R = out.shape
    nb, bb = wi.shape[1], wi.shape[2]
    with_min = wm.shape[0] > 0
    k4 = xq4.shape[1]
    wflat = wi.reshape(-1)  # flat views: offsets instead of a row view per block
    dflat = wd.reshape(-1)
    mflat = wm.reshape(-1)
    xflat = xq4.reshape(-1)
    facc_flat = facc.reshape(-1)
    facc2 = facc_flat[TOKEN_TILE * GROUP:]  # a pair's second group
    xdf = xd.reshape(-1)
    xsf = xsum.reshape(-1)
    dtmp = np.empty(GROUP, np.float32)  # the block's scales and mins as float32
    mtmp = np.empty(GROUP, np.float32)
    chunk = token_chunk(xq4.shape[1] * 4)
    for c0 in range(0, T, chunk):  # tokens in chunks whose activations stay in L2 over all the groups
        c1 = min(T, c0 + chunk)
        g = g0
        while g < g1:
            # a GEMM runs two row groups per four-token tile where it can (as the K-quant kernel):
            # each token's broadcast quads meet both groups' weights
            two = HAS_F16C and c1 - c0 > TOKEN_TILE and g + 1 < g1
            t = c0
            while t < c1:
                n = min(TOKEN_TILE, c1 - t)  # 3 tokens share a padded four-token tile
                for u in range(n):
                    for ln in range(GROUP):
                        facc[u, ln] = 0.0
                        facc[TOKEN_TILE + u, ln] = 0.0
                if two and n == TOKEN_TILE:
                    _i8_pair_fmt(fmt, with_min, facc_flat, facc2, wflat, g * nb * bb, (g + 1) * nb * bb, xflat, xdf, xsf,
                                 dflat, mflat, g * nb * GROUP, (g + 1) * nb * GROUP, nb, t, k4, w_offset)
                elif HAS_F16C:  # one IR loop over the blocks, the tile's accumulators in registers
                    _i8_tile(n, fmt, with_min, facc_flat, wflat, g * nb * bb, xflat, xdf, xsf, dflat, mflat,
                             g * nb * GROUP, nb, t, k4, w_offset)
                    if two:  # a pair's last short tile: each group alone
                        _i8_tile(n, fmt, with_min, facc2, wflat, (g + 1) * nb * bb, xflat, xdf, xsf, dflat, mflat,
                                 (g + 1) * nb * GROUP, nb, t, k4, w_offset)
                else:  # scales converted one by one: block by block through memory
                    for b in range(nb):
                        prefetch(dflat, (g * nb + b) * GROUP + PREFETCH_SCALES)
                        if with_min:
                            prefetch(mflat, (g * nb + b) * GROUP + PREFETCH_SCALES)
                        wo = (g * nb + b) * bb
                        x0 = t * k4 + b * 8
                        if n > 1:
                            dot_tile4(fmt, iacc, wflat, wo, xflat, x0, x0 + k4, x0 + min(2, n - 1) * k4,
                                      x0 + min(3, n - 1) * k4)
                        else:
                            dot_tile(1, fmt, iacc, wflat, wo, xflat, x0, k4)
                        so = (g * nb + b) * GROUP
                        block_scales(dflat, so, dtmp, 0)
                        if with_min:
                            block_scales(mflat, so, mtmp, 0)
                        for u in range(n):  # the one float sequence of every (token, row): GEMV and GEMM alike
                            xs = xsum[t + u, b]
                            dx = xd[t + u, b]
                            if with_min:
                                scale_min_accumulate(facc_flat, u * GROUP, iacc, u * GROUP, np.int32(w_offset) * xs,
                                                     dtmp, 0, dx, mtmp, dx * np.float32(xs))
                            else:
                                scale_accumulate(facc_flat, u * GROUP, iacc, u * GROUP, np.int32(w_offset) * xs,
                                                 dtmp, 0, dx)
                store_tile(out, facc_flat, t, n, g)
                if two:
                    store_tile(out, facc2, t, n, g + 1)
                t += n
            g += 2 if two else 1


@kernel(parallel=True)
def matmul_i8_kernel(xq4, xd, xsum, wi, wd, wm, w_offset, fmt, out, n_threads):
    """out[t, r] for r < out.shape[1]: xq4/xd/xsum from quantize_rows_q8; wi: uint8 [G, nb,
    512 | 256 | 320] (8-, 4- or 5-bit format); wd: uint16 [G, nb, 16] block scales (f16 bits);
    wm: uint16 [G, nb, 16] block mins, or empty [0, 0, 0]; w_offset: int, the u8 value of a zero
    weight; fmt: the format (I8Weights.fmt; rows past R are padding). Tokens go TOKEN_TILE at a time (each weight quad loaded
    once for all of them), the rest one by one; both give the same integers and the same float
    epilogue, so the same bits."""
    G = wi.shape[0]
    per = (G + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        iacc = np.zeros(TOKEN_TILE * GROUP, np.int32)
        facc = np.zeros((2 * TOKEN_TILE, GROUP), np.float32)
        _i8_groups(xq4, xd, xsum, wi, wd, wm, w_offset, fmt, out, tid * per, min(G, (tid + 1) * per), iacc, facc)


@kernel(parallel=True)
def matmul3_i8_kernel(x, xq4, xd, xsum, wia, wda, wma, offa, fa, outa, wib, wdb, wmb, offb, fb, outb,
                      wic, wdc, wmc, offc, fc, outc, n_threads):
    """Up to three int8 matmuls of the same float input x [T, K] in one launch (Q, K and V; gate
    and up; or one matrix): x is quantized into xq4/xd/xsum (as by quantize_rows_q8), then the
    row groups of all the matrices are split evenly over n_threads, each computed exactly as by
    matmul_i8_kernel. A matrix with zero groups is skipped. Per matrix m: wi_m, wd_m, wm_m,
    off_m, f_m, out_m as matmul_i8_kernel's wi, wd, wm, w_offset, fmt, out (I8Weights.args, out)."""
    quantize_rows_q8(x, xq4, xd, xsum)  # serially when small: no second launch
    na, nb, nc = wia.shape[0], wib.shape[0], wic.shape[0]
    total = na + nb + nc
    per = (total + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        iacc = np.zeros(TOKEN_TILE * GROUP, np.int32)
        facc = np.zeros((2 * TOKEN_TILE, GROUP), np.float32)
        lo, hi = tid * per, min(total, (tid + 1) * per)
        if lo < na:
            _i8_groups(xq4, xd, xsum, wia, wda, wma, offa, fa, outa, lo, min(hi, na), iacc, facc)
        if hi > na and lo < na + nb:
            _i8_groups(xq4, xd, xsum, wib, wdb, wmb, offb, fb, outb, max(lo, na) - na, min(hi, na + nb) - na, iacc, facc)
        if hi > na + nb:
            _i8_groups(xq4, xd, xsum, wic, wdc, wmc, offc, fc, outc, max(lo, na + nb) - na - nb, hi - na - nb, iacc, facc)
