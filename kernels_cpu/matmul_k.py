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
have a tile of their own (an expert of a batched step typically gets that many). A GEMM
unpacks a row group's scales once per token chunk (every super-block into a slot of the
thread's scratch), then runs each tile over the group's whole rows in one call, two groups
per four-token tile where the thread has two (simd_tile.k_pair_tile: each broadcast
activation quad feeds both; the grids stay one group at a time); a few tokens
(a GEMV) of Q4_K, Q5_K or Q6_K run one tile call over the group's whole rows, which makes each
block's float scales from the record's header in its loop (simd_tile's MODE_*_INLINE: unpacking
into scratch and reading back had taken ~25% of a Q4_K GEMV); the other types' GEMVs unpack a
super-block's scales just before the tile reads its codes, one call per super-block. The loop nest is compiled without numba's
reference counting: around each call in a branch it cost ~100 ns, 3x a GEMV's arithmetic.
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
    store_tile,
)
from .simd_k import scale_rows, widen_odd_nibbles, widen_scales
from .simd_tile import (
    MODE_MIN,
    MODE_MIN_INLINE,
    MODE_SCALE,
    MODE_SPLIT,
    MODE_SPLIT_INLINE,
    MODE_TQ,
    k_pair_tile,
    k_super_tile,
)

# per format code: the grid formats' factor of d (weight_types.GridCodes.d_factor), and whether
# their scales are per 16 columns
_D_FACTOR = tuple(GRIDS[f].d_factor if f in GRIDS else 1.0 for f in range(max(GRIDS) + 1))
_SPLIT = tuple(f in SPLIT_FORMATS for f in range(max(GRIDS) + 1))


@kernel(inline=True)
def _tile_fmt(ntok, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0):
    """k_super_tile with its literal format and the mode it implies: bits 4, 5 (Q4_K, Q5_K:
    MODE_MIN), 6 (Q6_K: MODE_SPLIT), 2 (TQ1_0, TQ2_0: MODE_TQ), else IQ4_XS's table format
    (MODE_SCALE); ntok: a literal 1, 2 or 4 (inlined: it stays a literal)."""
    if bits == 4:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_MIN, 4, ntok)
    elif bits == 5:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_MIN, 5, ntok)
    elif bits == 6:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_SPLIT, 6, ntok)
    elif bits == 2:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_TQ, 2, ntok)
    else:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_SCALE, FMT_IQ4,
                     ntok)


@kernel(inline=True)
def _super_tile(n, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns, j0):
    """Super-block s of the tile of n tokens from t (3 padded to four by repeating the last)."""
    ta, tb, tc, td = t, t + min(1, n - 1), t + min(2, n - 1), t + min(3, n - 1)
    if n == 1:
        _tile_fmt(1, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, ta, ta, ta, k4, nxd, nxs, s0, ns, j0)
    elif n == 2:  # a MoE step's expert with two pairs: no padded work
        _tile_fmt(2, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tb, tb, k4, nxd, nxs, s0, ns, j0)
    else:
        _tile_fmt(4, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0)


@kernel(inline=True)
def _inline_fmt(ntok, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0):
    """Q4_K / Q5_K (bits 4, 5) and Q6_K (6) with their scales made in the tile from the records
    (MODE_MIN_INLINE, MODE_SPLIT_INLINE): no scratch slots."""
    if bits == 4:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                     MODE_MIN_INLINE, 4, ntok)
    elif bits == 5:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                     MODE_MIN_INLINE, 5, ntok)
    else:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                     MODE_SPLIT_INLINE, 6, ntok)


@kernel(inline=True)
def _inline_tile(n, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns, j0):
    """_super_tile's tokens for _inline_fmt."""
    ta, tb, tc, td = t, t + min(1, n - 1), t + min(2, n - 1), t + min(3, n - 1)
    if n == 1:
        _inline_fmt(1, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, ta, ta, ta, k4, nxd, nxs, s0, ns, j0)
    elif n == 2:
        _inline_fmt(2, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tb, tb, k4, nxd, nxs, s0, ns, j0)
    else:
        _inline_fmt(4, bits, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0)


@kernel(inline=True)
def _pair_fmt(bits, facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns, j0, j2):
    """k_pair_tile of the four tokens from t with its literal format and mode (as _tile_fmt)."""
    ta, tb, tc, td = t, t + 1, t + 2, t + 3
    if bits == 4:
        k_pair_tile(facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                    j2, MODE_MIN, 4, 4)
    elif bits == 5:
        k_pair_tile(facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                    j2, MODE_MIN, 5, 4)
    elif bits == 6:
        k_pair_tile(facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                    j2, MODE_SPLIT, 6, 4)
    elif bits == 2:
        k_pair_tile(facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                    j2, MODE_TQ, 2, 4)
    else:
        k_pair_tile(facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                    j2, MODE_SCALE, FMT_IQ4, 4)


@kernel(inline=True)
def _staged_fmt(ntok, half16, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0):
    """k_super_tile on a grid's super-block staged as 8-bit codes: MODE_SPLIT with scales per 16
    (half16), else MODE_SCALE (a dispatch of its own: the K-quants' call site compiles none of it)."""
    if half16:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_SPLIT, 8, ntok)
    else:
        k_super_tile(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, MODE_SCALE, 8, ntok)


@kernel(inline=True)
def _staged_tile(n, half16, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns, j0):
    """_super_tile's tokens for a staged grid super-block."""
    ta, tb, tc, td = t, t + min(1, n - 1), t + min(2, n - 1), t + min(3, n - 1)
    if n == 1:
        _staged_fmt(1, half16, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, ta, ta, ta, k4, nxd, nxs, s0, ns, j0)
    elif n == 2:
        _staged_fmt(2, half16, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tb, tb, k4, nxd, nxs, s0, ns, j0)
    else:
        _staged_fmt(4, half16, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0)


# how a type's super-block scales unpack (_scales_of): one literal per kind, so each kind's loop
# has no branches (numba's reference counting of the scratch arrays, left in branches, cost
# ~65 ns a super-block: 8x the unpacking itself)
_Q6, _GRID16, _GRID32, _IQ4, _TQ, _MINS = 0, 1, 2, 3, 4, 5


@kernel(inline=True)
def _scales_of(kind, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms):
    """The scales of the n super-block records from byte base0 (rec bytes apart), unpacked for
    their 16 rows, super-block j into slot k = j0 + j of the scratch: dtmp[16 k ...] (d), and by kind
    isc[256 k ...] (int scales: Q6_K's, the grids' per 16), ds / ms [128 k ...] (float scales
    and negated mins per block); imn (int32, as isc) and mtmp (float32 [16]): temporaries."""
    for j in range(n):
        base = base0 + j * rec
        k = j0 + j
        d0, i0, f0 = k * GROUP, k * 256, k * 128
        block_scales(w16, base // 2, dtmp, d0)
        if kind == _Q6:
            widen_scales(isc, i0, wflat, base + 32, 16)
        elif kind == _GRID16 or kind == _GRID32:
            for ln in range(GROUP):
                dtmp[d0 + ln] = dtmp[d0 + ln] * dfac
            if kind == _GRID16:
                widen_odd_nibbles(isc, i0, wflat, base + 32, 16)
            else:
                widen_odd_nibbles(isc, f0, wflat, base + 32, 8)
                scale_rows(ds, isc, f0, 8, dtmp, d0, False)
        elif kind == _IQ4:
            widen_scales(isc, f0, wflat, base + 32, 8)
            scale_rows(ds, isc, f0, 8, dtmp, d0, False)
        elif kind == _MINS:
            block_scales(w16, base // 2 + GROUP, mtmp, 0)
            widen_scales(isc, f0, wflat, base + 64, 8)  # sc and m below 64: sign-extending keeps them
            widen_scales(imn, f0, wflat, base + 192, 8)
            scale_rows(ds, isc, f0, 8, dtmp, d0, False)
            scale_rows(ms, imn, f0, 8, mtmp, 0, True)


@kernel(inline=True)
def _group_scales(kind, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms):
    """_scales_of with its literal kind."""
    if kind == _Q6:
        _scales_of(_Q6, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)
    elif kind == _GRID16:
        _scales_of(_GRID16, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)
    elif kind == _GRID32:
        _scales_of(_GRID32, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)
    elif kind == _IQ4:
        _scales_of(_IQ4, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)
    elif kind == _TQ:
        _scales_of(_TQ, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)
    else:
        _scales_of(_MINS, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)


@kernel(inline=True)
def _prepare(kind, grid, bits, w16, wflat, base0, rec, n, j0, head, blk, dfac, dtmp, mtmp, isc, imn, ds, ms, stage):
    """The n super-blocks from byte base0 into scratch slots j0 .. j0 + n - 1: their scales, and
    a grid's codes staged as 8-bit codes (slot k at stage[4096 k ...])."""
    _group_scales(kind, w16, wflat, base0, rec, n, j0, dfac, dtmp, mtmp, isc, imn, ds, ms)
    if grid:
        for j in range(n):
            for b in range(8):
                grid_stage(bits, stage, 4096 * (j0 + j) + 512 * b, wflat, base0 + j * rec + head + b * blk)


@kernel(inline=True)
def _tile(grid, half16, n, bits, facc, wflat, stage, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns,
          j0):
    """The tile of n tokens from t over super-blocks s0 .. s0 + ns - 1 (scratch slots j0 ...):
    a grid's from its staged codes, the others' from the weights at byte wo."""
    if grid:
        _staged_tile(n, half16, facc, stage, 4096 * j0, 4096, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns,
                     j0)
    else:
        _super_tile(n, bits, facc, wflat, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, ns, j0)


@kernel(refcount=False)
def _k_groups(xflat, xdf, xsf, k4, nxd, nxs, wflat, w16, S, B, qtype, bits, head, out, g0, g1, isc, imn, facc, facc2,
              dtmp, mtmp, ds, ms, stage):
    """Row groups g0..g1-1 of one K-quant matrix for every token (see matmul_k_kernel), its
    arrays flat (views made by the caller: this nest is compiled without reference counting, and
    a view's helper compiled with it elsewhere in the process would count a reference here that
    nothing releases): activations xflat (int32 quads, k4 per token), xdf (nxd scales per
    token), xsf (nxs sums per token); weights wflat (uint8, S super-block records of B bytes per
    group) and w16 (the same bytes as uint16). Scratch
    of the calling thread, per super-block slot j (a GEMM's two groups: 2S of them; a GEMV: 2):
    isc, imn int32 [256 j ...], dtmp float32 [16 j ...], ds, ms float32 [128 j ...]; mtmp
    float32 [16]; facc, facc2 float32 [TOKEN_TILE * GROUP] (a pair's second group); stage uint8 (a grid format's blocks as 8-bit
    codes, 8 * 512 bytes per slot) or empty. Compiled without numba's reference counting (it
    allocates nothing): around each call in a branch it cost ~100 ns, 3x a GEMV's arithmetic."""
    T = out.shape[0]
    grid = bits >= FMT_GRID  # codebook codes, 4-bit scales 2s + 1 per 32 columns, or per 16 (half16)
    half16 = grid and _SPLIT[bits]
    if qtype == Q6_K:  # int8 scales per 16 columns, no mins
        kind = _Q6
    elif grid:
        kind = _GRID16 if half16 else _GRID32
    elif qtype == IQ4_XS:  # int8 scales per 32 columns, table codes, no mins
        kind = _IQ4
    elif qtype == TQ1_0 or qtype == TQ2_0:  # one scale d per row, codes t of d * (t - 1)
        kind = _TQ
    else:  # Q4_K / Q5_K: scales and mins (bytes)
        kind = _MINS
    dfac = np.float32(_D_FACTOR[bits])
    blk = block_bytes(bits)  # one 32-column block of 16 rows in the format
    chunk = token_chunk(k4 * 4)
    for c0 in range(0, T, chunk):  # tokens in chunks whose activations stay in L2 over all the groups
        c1 = min(T, c0 + chunk)
        # a GEMM prepares a group's scales (and a grid's codes, staged as 8-bit codes) once for
        # all the chunk's tiles, then runs each tile over the whole rows; a few tokens (a GEMV)
        # go a super-block at a time, preparing the next one's (into the other of two slots)
        # before computing this one, so the preparation overlaps the dot products
        gemm = c1 - c0 > TOKEN_TILE
        per = S if gemm else 1  # super-blocks per step
        steps = S // per
        g = g0
        while g < g1:
            # a GEMM runs two row groups per tile where it can: each token's broadcast quads then
            # meet both groups' weights (the tile's loads were its bound); the grids stay one
            two = gemm and not grid and g + 1 < g1
            wa, wb = g * S * B, (g + 1) * S * B
            t = c0
            while t < c1:  # token tiles over the group's whole rows, accumulators in registers
                n = min(TOKEN_TILE, c1 - t)  # tokens of this tile: 3 share a padded four-token tile
                for u in range(n):  # one vector store per token (a loop over n * 16 became a memset call)
                    for ln in range(GROUP):
                        facc[u * GROUP + ln] = 0.0
                        facc2[u * GROUP + ln] = 0.0
                if two:  # both groups' scales once per token chunk, slots 0 .. S - 1 and S .. 2S - 1
                    if t == c0:
                        _prepare(kind, grid, bits, w16, wflat, wa, B, S, 0, head, blk, dfac, dtmp, mtmp, isc, imn, ds, ms,
                                 stage)
                        _prepare(kind, grid, bits, w16, wflat, wb, B, S, S, head, blk, dfac, dtmp, mtmp, isc, imn, ds, ms,
                                 stage)
                    if n == TOKEN_TILE:
                        _pair_fmt(bits, facc, facc2, wflat, wa + head, wb + head, B, xflat, xdf, xsf, ds, ms, dtmp, isc, t,
                                  k4, nxd, nxs, 0, S, 0, S)
                    else:
                        _super_tile(n, bits, facc, wflat, wa + head, B, xflat, xdf, xsf, ds, ms, dtmp, isc, t, k4, nxd, nxs,
                                    0, S, 0)
                        _super_tile(n, bits, facc2, wflat, wb + head, B, xflat, xdf, xsf, ds, ms, dtmp, isc, t, k4, nxd,
                                    nxs, 0, S, S)
                    store_tile(out, facc2, t, n, g + 1)
                elif (kind == _MINS or kind == _Q6) and not gemm:  # scales made in the tile: one call
                    _inline_tile(n, bits, facc, wflat, wa + head, B, xflat, xdf, xsf, ds, ms, dtmp, isc, t, k4, nxd,
                                 nxs, 0, S, 0)
                else:
                    for i in range(steps + 1):  # prepare step i, compute step i - 1
                        if i < steps and (t == c0 or not gemm):
                            _prepare(kind, grid, bits, w16, wflat, wa + i * per * B, B, per, 0 if gemm else i % 2, head,
                                     blk, dfac, dtmp, mtmp, isc, imn, ds, ms, stage)
                        if i > 0:
                            s0 = (i - 1) * per
                            _tile(grid, half16, n, bits, facc, wflat, stage, wa + s0 * B + head, B, xflat, xdf, xsf,
                                  ds, ms, dtmp, isc, t, k4, nxd, nxs, s0, per, 0 if gemm else (i - 1) % 2)
                store_tile(out, facc, t, n, g)
                t += n
            g += 2 if two else 1


@kernel(inline=True)
def _k_range(xq4, xd, xs16, wk, qtype, bits, head, out, g0, g1):
    if g1 <= g0:
        return
    S = max(2, 2 * wk.shape[1])  # a scale slot per super-block of two row groups (at least the GEMV's 2)
    isc = np.empty(S * 256, np.int32)
    imn = np.empty(S * 256, np.int32)
    facc = np.empty(TOKEN_TILE * GROUP, np.float32)
    facc2 = np.empty(TOKEN_TILE * GROUP, np.float32)
    dtmp = np.empty(S * GROUP, np.float32)
    mtmp = np.empty(GROUP, np.float32)
    ds = np.empty(S * 128, np.float32)
    ms = np.empty(S * 128, np.float32)
    n_stage = 0 if bits < FMT_GRID else wk.shape[1] * 8 if xq4.shape[0] > TOKEN_TILE else 16  # blocks: a group's, or 2
    stage = np.empty(512 * n_stage, np.uint8)
    wflat = wk.reshape(-1)
    _k_groups(xq4.reshape(-1), xd.reshape(-1), xs16.reshape(-1), xq4.shape[1], xd.shape[1], xs16.shape[1], wflat,
              wflat.view(np.uint16), wk.shape[1], wk.shape[2], qtype, bits, head, out, g0, g1, isc, imn, facc, facc2, dtmp, mtmp,
              ds, ms, stage)


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
