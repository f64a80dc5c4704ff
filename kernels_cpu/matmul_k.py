"""Integer matmul for the K-quants (Q4_K, Q5_K, Q6_K), IQ4_XS, the IQ1/IQ2/IQ3 grids, TQ1_0 and
TQ2_0: activations quantized per 32 values as
for the other int8 matrices (int8 codes, a float scale per 32; plus sums per 16), u8 x s8 dot
products per 32-column block (the vpdpbusd code of kernels_cpu.simd_i8), a float epilogue per
block with the block's weight scale.

Weights come repacked by kernels_cpu.repack_k; per super-block their 6- or 8-bit sub-block
scales are unpacked once to float row vectors (d * sc and dmin * m are exact in float32: an
f16 times a 6-bit integer). Per row lane, 32-column block b, token x (codes xq, scale dx, sums
per 16 xs, sum per 32 xsum = xs_2b + xs_2b+1):
    Q4_K / Q5_K:  acc += float(dot(code_b, xq_b)) * ((d * sc_b) * dx) + (-(dmin * m_b)) * (dx * float(xsum))
    Q6_K:         isum = sc_2b * (dot_lo - 32 * xs_2b) + sc_2b+1 * (dot_hi - 32 * xs_2b+1)   (exact int32)
                  acc += float(isum) * (d * dx)
    IQ4_XS:       acc += float(dot(table code_b, xq_b) - offset * xsum) * ((d * sc_b) * dx)
                  (codes read through IQ4_NL's table as the 8-bit format's bytes; simd_dot)
    IQ1/IQ2/IQ3 grids: the same with sc_b = 2s + 1 and d times the type's factor (1/8 IQ2 and
                  IQ1, 1/4 IQ3_XXS), or per 16 columns as Q6_K with the offset for 32 (IQ2_XS,
                  IQ2_S, IQ1_M); the signed grid bytes + offset gathered per quad (simd_dot) into
                  the 8-bit format (staged: a super-block at a time, or a GEMM's row group once
                  per token chunk), then computed by the same super-block tile as the K-quants
    TQ1_0, TQ2_0: acc += float(dot(code_b, xq_b) - xsum) * (d * dx)   (2-bit codes 0..2)
A per-256 activation scale (llama.cpp's Q8_K, which would let the scales combine in integers)
was tried first: on gemma3 it doubled the mean KL against exact math (0.0015 -> 0.0055). Every
token runs the same sequence whatever the batch (four share each weight load in the GEMM path),
so GEMV and GEMM rows are bit-identical and the thread count changes nothing. Three tokens
left over share one four-token tile (the last repeated as padding, never written out); two
have a tile of their own (an expert of a batched step typically gets that many). A row
group's super-blocks are the outer loop over a token chunk's tiles: each one's scales are
unpacked once for all of them, and its weights stay in L1 while every tile reads them.
"""

from __future__ import annotations

import numba
import numpy as np

from edge_infer.formats.weight_types import IQ4_XS, Q6_K, TQ1_0, TQ2_0

from ._jit import kernel
from .matmul_i8 import TOKEN_TILE, quantize_rows_q8, token_chunk
from .simd_dot import FMT_GRID, FMT_IQ4, GRIDS, SPLIT_FORMATS
from .simd_i8 import (
    GROUP,
    block_bytes,
    block_scales,
    grid_stage,
)
from .simd_k import scale_rows, unpack_scales_q4k, widen_odd_nibbles, widen_scales
from .simd_tile import MODE_MIN, MODE_SCALE, MODE_SPLIT, MODE_TQ, k_super_tile

# per format code: the grid formats' factor of d (weight_types.GridCodes.d_factor), and whether
# their scales are per 16 columns
_D_FACTOR = tuple(GRIDS[f].d_factor if f in GRIDS else 1.0 for f in range(max(GRIDS) + 1))
_SPLIT = tuple(f in SPLIT_FORMATS for f in range(max(GRIDS) + 1))


@kernel(inline=True)
def _tile_fmt(ntok, bits, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s):
    """k_super_tile with its literal format and the mode it implies: bits 4, 5 (Q4_K, Q5_K:
    MODE_MIN), 6 (Q6_K: MODE_SPLIT), 2 (TQ1_0, TQ2_0: MODE_TQ), else IQ4_XS's table format
    (MODE_SCALE); ntok: a literal 1, 2 or 4 (inlined: it stays a literal)."""
    if bits == 4:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_MIN, 4, ntok)
    elif bits == 5:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_MIN, 5, ntok)
    elif bits == 6:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_SPLIT, 6, ntok)
    elif bits == 2:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_TQ, 2, ntok)
    else:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_SCALE, FMT_IQ4,
                     ntok)


@kernel(inline=True)
def _super_tile(n, bits, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s):
    """Super-block s of the tile of n tokens from t (3 padded to four by repeating the last)."""
    ta, tb, tc, td = t, t + min(1, n - 1), t + min(2, n - 1), t + min(3, n - 1)
    if n == 1:
        _tile_fmt(1, bits, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, ta, ta, ta, k4, nxd, nxs, s)
    elif n == 2:  # a MoE step's expert with two pairs: no padded work
        _tile_fmt(2, bits, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tb, tb, k4, nxd, nxs, s)
    else:
        _tile_fmt(4, bits, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s)


@kernel(inline=True)
def _staged_fmt(ntok, half16, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s):
    """k_super_tile on a grid's super-block staged as 8-bit codes: MODE_SPLIT with scales per 16
    (half16), else MODE_SCALE (a dispatch of its own: the K-quants' call site compiles none of it)."""
    if half16:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_SPLIT, 8, ntok)
    else:
        k_super_tile(facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s, MODE_SCALE, 8, ntok)


@kernel(inline=True)
def _staged_tile(n, half16, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s):
    """_super_tile's tokens for a staged grid super-block."""
    ta, tb, tc, td = t, t + min(1, n - 1), t + min(2, n - 1), t + min(3, n - 1)
    if n == 1:
        _staged_fmt(1, half16, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, ta, ta, ta, k4, nxd, nxs, s)
    elif n == 2:
        _staged_fmt(2, half16, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tb, tb, k4, nxd, nxs, s)
    else:
        _staged_fmt(4, half16, facc, w, wo, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s)


@kernel(inline=True)
def _super_scales(q6, grid, half16, iq4, tq, w16, wflat, base, dfac, dtmp, mtmp, isc, imn, ds, ms):
    """The scales of the super-block record at byte base, unpacked for its 16 rows: dtmp (d),
    and by type isc (int scales), ds / ms (float scales and negated mins per block), mtmp."""
    block_scales(w16, base // 2, dtmp)
    if q6:
        widen_scales(isc, wflat, base + 32, 16)
    elif grid:
        for ln in range(GROUP):
            dtmp[ln] = dtmp[ln] * dfac
        if half16:
            widen_odd_nibbles(isc, wflat, base + 32, 16)
        else:
            widen_odd_nibbles(isc, wflat, base + 32, 8)
            scale_rows(ds, isc, 8, dtmp, False)
    elif iq4:
        widen_scales(isc, wflat, base + 32, 8)
        scale_rows(ds, isc, 8, dtmp, False)
    elif not tq:
        block_scales(w16, base // 2 + GROUP, mtmp)
        unpack_scales_q4k(isc, imn, wflat, base + 64)
        scale_rows(ds, isc, 8, dtmp, False)
        scale_rows(ms, imn, 8, mtmp, True)


@kernel
def _k_groups(xq4, xd, xs16, wk, qtype, bits, head, out, g0, g1, isc, imn, facc, dtmp, mtmp, ds, ms, stage):
    """Row groups g0..g1-1 of one K-quant matrix for every token (see matmul_k_kernel). Scratch
    of the calling thread: isc, imn int32 [16 * GROUP]; facc float32 [(a token chunk's tokens +
    TOKEN_TILE) * GROUP]; dtmp, mtmp float32 [GROUP]; ds, ms float32 [8 * GROUP]; stage uint8 (a grid format's blocks as 8-bit codes: a super-block's 8 * 512
    bytes, or S * 8 * 512 for a GEMM's whole group) or empty."""
    T, R = out.shape
    S, B = wk.shape[1], wk.shape[2]
    q6 = qtype == Q6_K  # int8 scales per 16 columns, no mins (else Q4_K / Q5_K packed scales and mins)
    iq4 = qtype == IQ4_XS  # int8 scales per 32 columns, table codes, no mins
    tq = qtype == TQ1_0 or qtype == TQ2_0  # one scale d per row, codes t of d * (t - 1)
    grid = bits >= FMT_GRID  # codebook codes, 4-bit scales 2s + 1 per 32 columns, or per 16 (half16)
    half16 = grid and _SPLIT[bits]
    dfac = np.float32(_D_FACTOR[bits])
    blk = block_bytes(bits)  # one 32-column block of 16 rows in the format
    k4 = xq4.shape[1]
    wflat = wk.reshape(-1)
    w16 = wflat.view(np.uint16)
    xflat = xq4.reshape(-1)
    xdf = xd.reshape(-1)
    xsf = xs16.reshape(-1)
    chunk = token_chunk(xq4.shape[1] * 4)
    for c0 in range(0, T, chunk):  # tokens in chunks whose activations stay in L2 over all the groups
        c1 = min(T, c0 + chunk)
        for g in range(g0, g1):
            if not grid:  # super-blocks outermost: each one's scales unpacked once for all the chunk's tiles
                for i in range((c1 - c0) * GROUP):
                    facc[i] = 0.0
                for s in range(S):
                    base = (g * S + s) * B
                    _super_scales(q6, False, False, iq4, tq, w16, wflat, base, dfac, dtmp, mtmp, isc, imn, ds, ms)
                    t = c0
                    while t < c1:  # one IR sequence per tile and super-block, accumulators in registers
                        n = min(TOKEN_TILE, c1 - t)  # tokens of this tile: 3 share a padded four-token tile
                        _super_tile(n, bits, facc[(t - c0) * GROUP :], wflat, base + head, xflat, xdf, xsf, ds, ms,
                                    dtmp, isc, t, k4, xd.shape[1], xs16.shape[1], s)
                        t += n
                for u in range(c1 - c0):
                    for ln in range(min(GROUP, R - g * GROUP)):
                        out[c0 + u, g * GROUP + ln] = facc[u * GROUP + ln]
                continue
            # the grid types: codebook codes staged as 8-bit codes, a super-block at a time, or a
            # GEMM's whole group at its first tile, then computed as a K-quant super-block of them
            staged = c1 - c0 > TOKEN_TILE
            t = c0
            while t < c1:
                n = min(TOKEN_TILE, c1 - t)
                for i in range(n * GROUP):
                    facc[i] = 0.0
                for s in range(S):
                    base = (g * S + s) * B
                    _super_scales(q6, grid, half16, iq4, tq, w16, wflat, base, dfac, dtmp, mtmp, isc, imn, ds, ms)
                    so = 4096 * s if staged else 0
                    if not staged or t == c0:
                        for b in range(8):
                            grid_stage(bits, stage, so + 512 * b, wflat, base + head + b * blk)
                    _staged_tile(n, half16, facc, stage, so, xflat, xdf, xsf, ds, ms, dtmp, isc, t, k4, xd.shape[1],
                                 xs16.shape[1], s)
                for u in range(n):
                    for ln in range(min(GROUP, R - g * GROUP)):
                        out[t + u, g * GROUP + ln] = facc[u * GROUP + ln]
                t += n


@kernel(inline=True)
def _k_range(xq4, xd, xs16, wk, qtype, bits, head, out, g0, g1):
    if g1 <= g0:
        return
    isc = np.empty(16 * GROUP, np.int32)
    imn = np.empty(16 * GROUP, np.int32)
    # a chunk's tokens and a padded last tile's (a four-token tile writes four rows)
    facc = np.empty((min(xq4.shape[0], token_chunk(xq4.shape[1] * 4)) + TOKEN_TILE) * GROUP, np.float32)
    dtmp = np.empty(GROUP, np.float32)
    mtmp = np.empty(GROUP, np.float32)
    ds = np.empty(8 * GROUP, np.float32)
    ms = np.empty(8 * GROUP, np.float32)
    n_stage = 0 if bits < FMT_GRID else wk.shape[1] * 8 if xq4.shape[0] > TOKEN_TILE else 8  # blocks
    stage = np.empty(512 * n_stage, np.uint8)
    _k_groups(xq4, xd, xs16, wk, qtype, bits, head, out, g0, g1, isc, imn, facc, dtmp, mtmp, ds, ms, stage)


@kernel(parallel=True)
def matmul_k_kernel(xq4, xd, xs16, wk, qtype, bits, head, out, n_threads):
    """out[t, r] for r < out.shape[1]: xq4/xd/xs16 from quantize_rows_q8 (sums per 16); wk: uint8 [G, S, B]
    (kernels_cpu.repack_k) of GGML type qtype, whose K form has codes of format bits (a bit width
    or a table format) after head bytes of scales (KWeights.args). Row groups split evenly over n_threads."""
    G = wk.shape[0]
    per = (G + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        _k_range(xq4, xd, xs16, wk, qtype, bits, head, out, tid * per, min(G, (tid + 1) * per))


@kernel(parallel=True)
def matmul3_k_kernel(x, xq4, xd, xs16, wka, qa, ba, ha, outa, wkb, qb, bb, hb, outb, wkc, qc, bc, hc, outc,
                     n_threads):
    """Up to three K-quant matmuls of the same float input x [T, K] in one launch (Q, K and V;
    gate and up; or one matrix): x quantized once (quantize_rows_q8 (sums per 16)), then the row groups of
    all the matrices split evenly over n_threads, each computed as by matmul_k_kernel. A matrix
    with zero groups is skipped."""
    quantize_rows_q8(x, xq4, xd, xs16)  # serially when small: no second launch
    na, nb, nc = wka.shape[0], wkb.shape[0], wkc.shape[0]
    total = na + nb + nc
    per = (total + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        lo, hi = tid * per, min(total, (tid + 1) * per)
        _k_range(xq4, xd, xs16, wka, qa, ba, ha, outa, lo, min(hi, na))
        _k_range(xq4, xd, xs16, wkb, qb, bb, hb, outb, max(lo, na) - na, min(hi, na + nb) - na)
        _k_range(xq4, xd, xs16, wkc, qc, bc, hc, outc, max(lo, na + nb) - na - nb, hi - na - nb)
