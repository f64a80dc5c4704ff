"""The int8 block dot product as LLVM IR, on the instructions kernels_cpu.simd_isa picks for this
target (VNNI `vpdpbusd`, aarch64 `sdot`, whose signed bytes hold the 4-, 5- and 6-bit codes as
they are and Q8_0's q + 128 as q after xor 0x80, AVX2 `vpmaddubsw` + `vpmaddwd`, or plain
vector IR that LLVM lowers for any target, all with the same exact integer sums): the code
formats (bit widths 8, 4, 5, 6, 2, the table formats and the grid formats) and the IR of one
16-row x 32-column block's sums. kernels_cpu.simd_i8 wraps it in numba intrinsics."""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir

from edge_infer.formats.quants_iq import grid as grid_values
from edge_infer.formats.weight_types import IQ4_TABLE, MXFP4_TABLE, TYPES, GridCodes

from .simd_isa import (
    HAS_AVX2_DOT,
    HAS_VNNI,
    HIGH_BITS_AS_MASKS,
    I16_QUADS,
    PREFETCH_BYTES,
    SIGNED_EIGHT,
    high_field_ir,
    maddubs16_ir,
    sdot16_ir,
    signed_dot_ir,
    widen16_ir,
)

# Formats beyond the bit widths 8, 4, 5, 6: 4-bit codes (the 4-bit format's bytes) read through
# a 16-entry table of int8 weights in registers (vpshufb, tbl) into the 8-bit format's bytes
# (q + 128, or q itself with SIGNED_EIGHT), so the arithmetic is the 8-bit format's at the 4-bit bytes.
FMT_IQ4, FMT_MXFP4 = 9, 10
TABLES = {FMT_IQ4: IQ4_TABLE, FMT_MXFP4: MXFP4_TABLE}
# the u8 code of a zero weight in the table formats' bytes (signed values + 128; with
# SIGNED_EIGHT the dot product reads q)
TABLE_OFFSET = 0 if SIGNED_EIGHT else 128
# The codebook types' formats (weight_types.GridCodes, in TYPES' order from 11): each quad's 16
# rows of 4 grid bytes gathered by index (vpgatherdd), their signs applied, as the 8-bit
# format's bytes (v + 128, which SIGNED_EIGHT's dot products read as v).
FMT_GRID = 11  # the first
GRIDS: dict[int, GridCodes] = dict(enumerate(
    (t.k.grid for t in TYPES if t.k is not None and t.k.grid is not None), start=FMT_GRID))
BLOCK_BYTES = {8: 512, 4: 256, 5: 320, 6: 384, 2: 128, FMT_IQ4: 256, FMT_MXFP4: 256,  # one 16-row x 32-column block
               **{f: g.block_bytes for f, g in GRIDS.items()}}
FMT_IQ2_XXS, FMT_IQ2_XS, FMT_IQ2_S, FMT_IQ3_XXS, FMT_IQ3_S = (
    next(f for f, g in GRIDS.items() if g.name == name) for name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"))
FMT_IQ1_S, FMT_IQ1_M = (next(f for f, g in GRIDS.items() if g.name == "IQ1_DELTA" and g.scale_cols == cols)
                        for cols in (32, 16))
SPLIT_FORMATS = frozenset({6, *(f for f, g in GRIDS.items() if g.scale_cols == 16)})  # a sum per 16 columns


def table_format(bits: int, table: tuple[int, ...] | None, grid: GridCodes | None = None) -> int:
    """The dot product's format code of a form: its bit width, or the table format of its
    table, or the grid format of its codebook codes."""
    if grid is not None:
        return next(f for f, g in GRIDS.items() if g == grid)
    if table is None:
        return bits
    return next(f for f, t in TABLES.items() if t == table)


def grid_dwords(g: GridCodes) -> np.ndarray:
    """The grid's int8 values as little-endian int32 words of 4 columns (an 8-wide entry e:
    words 2e, 2e + 1)."""
    return np.ascontiguousarray(grid_values(g.name).astype(np.int8)).view("<i4").reshape(-1)


def _gather_ir(builder, base, idx, scale, offset):
    """<16 x i32>: the words at base + offset + scale * idx (idx <16 x i32>): vpgatherdd zmm
    (AVX-512), two ymm gathers (AVX2), else 16 scalar loads."""
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v8, v16 = ir.VectorType(i32, 8), ir.VectorType(i32, 16)
    at = builder.gep(base, [ir.Constant(i64, offset)])
    if HAS_VNNI:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.mask.gather.dpi.512", fnty=ir.FunctionType(
            v16, [v16, i8.as_pointer(), v16, ir.VectorType(ir.IntType(1), 16), i32]))
        return builder.call(fn, [ir.Constant(v16, None), at, idx, ir.Constant(ir.VectorType(ir.IntType(1), 16), [1] * 16),
                                 ir.Constant(i32, scale)])
    if HAS_AVX2_DOT:
        fn = builder.module.declare_intrinsic("llvm.x86.avx2.gather.d.d.256", fnty=ir.FunctionType(
            v8, [v8, i8.as_pointer(), v8, v8, i8]))
        halves = [builder.call(fn, [ir.Constant(v8, None), at,
                                    builder.shuffle_vector(idx, idx, ir.Constant(v8, list(range(8 * h, 8 * h + 8)))),
                                    ir.Constant(v8, [-1] * 8), ir.Constant(i8, scale)]) for h in (0, 1)]
        return builder.shuffle_vector(halves[0], halves[1], ir.Constant(v16, list(range(16))))
    out = ir.Constant(v16, None)
    for lane in range(16):
        i = builder.sext(builder.extract_element(idx, ir.Constant(i32, lane)), i64)
        p = builder.gep(at, [builder.mul(i, ir.Constant(i64, scale))])
        out = builder.insert_element(out, builder.load(builder.bitcast(p, i32.as_pointer()), align=1), ir.Constant(i32, lane))
    return out


def _gather_rows_ir(builder, base, idx):
    """AVX-512: the 8-byte entries at base + 8 * idx (idx <16 x i32>) of rows 0-7 and 8-15, each
    as <16 x i32> (vpgatherdq zmm: half the elements of two dword gathers, measured 3.1 against
    5.3 ns a gather on the Zen 4 VM)."""
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v8i, v8q, v16 = ir.VectorType(i32, 8), ir.VectorType(i64, 8), ir.VectorType(i32, 16)
    fn = builder.module.declare_intrinsic("llvm.x86.avx512.mask.gather.dpq.512", fnty=ir.FunctionType(
        v8q, [v8q, i8.as_pointer(), v8i, ir.VectorType(ir.IntType(1), 8), i32]))
    out = []
    for h in (0, 1):
        part = builder.shuffle_vector(idx, idx, ir.Constant(v8i, list(range(8 * h, 8 * h + 8))))
        out.append(builder.bitcast(builder.call(fn, [ir.Constant(v8q, None), base, part,
                                                     ir.Constant(ir.VectorType(ir.IntType(1), 8), [1] * 8),
                                                     ir.Constant(i32, 8)]), v16))
    return out


def _grid_base(builder, fmt):
    """An i8 pointer to format fmt's grid words, a constant of the module."""
    i32 = ir.IntType(32)
    name = f"edge_infer_grid_{fmt}"
    try:
        g = builder.module.get_global(name)
    except KeyError:
        words = grid_dwords(GRIDS[fmt])
        ty = ir.ArrayType(i32, len(words))
        g = ir.GlobalVariable(builder.module, ty, name)
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(ty, [int(v) for v in words])
    return builder.bitcast(g, ir.IntType(8).as_pointer())


def grid_quads_ir(builder, wbase, fmt, sdot):
    """The 8 quads <64 x i8> of a grid format's block (GridCodes' layout) as the 8-bit format's
    bytes: per quad the rows' indices (low bytes, then the high bits' row masks), the gathered
    words, the sign mask's bytes negated (signed grids), + 128 (not on sdot, whose signed bytes
    take v)."""
    g = GRIDS[fmt]
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    v16, v16i8, v64i8 = ir.VectorType(i32, 16), ir.VectorType(i8, 16), ir.VectorType(i8, 64)
    n, high = 32 // g.width, g.index_bits - 8
    base = _grid_base(builder, fmt)

    def load(at, ty):
        return builder.load(builder.bitcast(builder.gep(wbase, [ir.Constant(i64, at)]), ty.as_pointer()), align=1)

    indices = []
    for j in range(n):
        iv = builder.zext(load(16 * j, v16i8), v16)
        for k in range(high):
            mask = builder.bitcast(load(16 * n + 2 * (k * n + j), i16), ir.VectorType(ir.IntType(1), 16))
            iv = builder.or_(iv, builder.select(mask, ir.Constant(v16, [1 << (8 + k)] * 16), ir.Constant(v16, None)))
        indices.append(iv)
    quads = []
    for q in range(8):
        if g.width == 4:
            words = _gather_ir(builder, base, indices[q], 4, 0)
        elif HAS_VNNI:  # two 8-row gathers of the whole 8-byte entries, split into the quads' words (vpermt2d)
            if q % 2 == 0:
                pair = _gather_rows_ir(builder, base, indices[q // 2])
            words = builder.shuffle_vector(pair[0], pair[1], ir.Constant(v16, [2 * r + q % 2 for r in range(16)]))
        else:
            words = _gather_ir(builder, base, indices[q // 2], 8, 4 * (q % 2))
        wb = builder.bitcast(words, v64i8)
        if g.signed:
            signs = builder.bitcast(load(16 * n + 2 * high * n + 8 * q, i64), ir.VectorType(ir.IntType(1), 64))
            wb = builder.select(signs, builder.sub(ir.Constant(v64i8, None), wb), wb)
        quads.append(wb if sdot else builder.xor(wb, ir.Constant(v64i8, [-128] * 64)))
    return quads


def _lookup_ir(builder, idx, table):
    """<64 x i8> of table[idx] (idx bytes 0..15) as the 8-bit format's bytes: v + 128 (v with SIGNED_EIGHT),
    one vpshufb (AVX-512BW; two on AVX2) or four tbl (aarch64), else a tree of selects."""
    i8, i32 = ir.IntType(8), ir.IntType(32)
    v16i8, v32i8, v64i8 = ir.VectorType(i8, 16), ir.VectorType(i8, 32), ir.VectorType(i8, 64)
    vals = [(v if SIGNED_EIGHT else v + 128) & 255 for v in table]
    if HAS_VNNI:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.pshuf.b.512", fnty=ir.FunctionType(v64i8, [v64i8, v64i8]))
        return builder.call(fn, [ir.Constant(v64i8, vals * 4), idx])
    if HAS_AVX2_DOT:
        fn = builder.module.declare_intrinsic("llvm.x86.avx2.pshuf.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
        halves = [builder.call(fn, [ir.Constant(v32i8, vals * 2),
                                    builder.shuffle_vector(idx, idx, ir.Constant(ir.VectorType(i32, 32),
                                                                                 list(range(32 * h, 32 * h + 32))))])
                  for h in (0, 1)]
        return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(i32, 64), list(range(64))))
    if platform.machine().lower() in ("aarch64", "arm64"):
        fn = builder.module.declare_intrinsic("llvm.aarch64.neon.tbl1.v16i8", fnty=ir.FunctionType(v16i8, [v16i8, v16i8]))
        parts = [builder.call(fn, [ir.Constant(v16i8, vals),
                                   builder.shuffle_vector(idx, idx, ir.Constant(ir.VectorType(i32, 16),
                                                                                list(range(16 * k, 16 * k + 16))))])
                 for k in range(4)]
        lo = builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(i32, 32), list(range(32))))
        hi = builder.shuffle_vector(parts[2], parts[3], ir.Constant(ir.VectorType(i32, 32), list(range(32))))
        return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(i32, 64), list(range(64))))
    level = [ir.Constant(v64i8, [v] * 64) for v in vals]  # select on bit 0, then 1, 2, 3
    for bit in range(4):
        on = builder.icmp_unsigned("!=", builder.and_(idx, ir.Constant(v64i8, [1 << bit] * 64)), ir.Constant(v64i8, None))
        level = [builder.select(on, level[2 * j + 1], level[2 * j]) for j in range(len(level) // 2)]
    return level[0]



def dot_block_ir(builder, wbase, xbase, xoffs, vnni, bits, split=False, sdot=False, avx2=False):
    """int32 <16 x i32> sums of one block for each x offset in xoffs: every weight quad is
    loaded once and meets each token's broadcast quad. Integer sums are exact, so how the
    products are split into chains changes no result: one token uses two chains (even and odd
    quads) to hide vpdpbusd's latency; several tokens are independent chains already.
    bits: the weight format, 8 (one byte per weight), 4 (4 loads, each giving quad q in its low
    and q + 4 in its high nibbles) or 5 (the 4-bit nibbles plus, per quad, a 64-bit mask of
    the fifth bits at 256 + 8q: bit 4l + k adds 16 to byte 4l + k) or 6 (the 5-bit format plus,
    per quad, a 64-bit mask of the sixth bits at 320 + 8q, adding 32); without
    HIGH_BITS_AS_MASKS the high bits are high_field_ir's byte fields in the same bytes.
    split: two sums per token, quads 0-3 (columns 0-15) and 4-7 (columns 16-31), for weights
    with a scale per 16 columns (Q6_K).
    A table format (TABLES): the 4-bit format's bytes, each nibble read through the table into
    the 8-bit format's byte, which the dot products then take as the 8-bit format's. 2 (the
    ternary types): two 64-byte loads, quad q in bits 2(q % 4)..2(q % 4) + 1 of load q // 4.
    (The grid formats are staged as 8-bit codes by grid_quads_ir, then read as the 8-bit format.)"""
    return dot_blocks_ir(builder, [wbase], xbase, xoffs, vnni, bits, split, sdot, avx2)[0]


def dot_blocks_ir(builder, wbases, xbase, xoffs, vnni, bits, split=False, sdot=False, avx2=False,
                  prefetch=PREFETCH_BYTES):
    """dot_block_ir's sums for the blocks of several row groups at wbases (a list; the result
    is a list per group) with the same tokens: each token's broadcast quad is loaded once and
    meets every group's weight quad, so two groups halve the broadcasts per dot product (the
    GEMM tile's load ports were its bound). With several groups the 4-bit formats take quad q
    and q + 4 from one load together (their high nibbles are not held across the block).
    prefetch: how many bytes ahead of each block its cache lines are prefetched (None: not
    prefetched)."""
    nibbles = bits not in (8, 2)
    table = TABLES.get(bits)
    eight = bits == 8 or table is not None  # 8-bit bytes at the dot product
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v16, v64i8, v64i32 = ir.VectorType(i32, 16), ir.VectorType(i8, 64), ir.VectorType(i32, 64)
    zero = ir.Constant(v16, None)
    chains = 2 if len(xoffs) == 1 or split else 1
    accs = [[[zero] * chains for _ in xoffs] for _ in wbases]
    pf = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i32, i32, i32]))
    for wbase in wbases if prefetch is not None else ():
        for line in range(BLOCK_BYTES[bits] // 64):  # the block's cache lines, `prefetch` ahead (read, keep, data)
            ahead = builder.gep(wbase, [ir.Constant(i64, prefetch + 64 * line)])
            builder.call(pf, [ahead, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    fn = None
    if vnni:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(v16, [v16, v16, v16]))
    elif sdot:
        v4, v16i8 = ir.VectorType(i32, 4), ir.VectorType(i8, 16)
        fn = builder.module.declare_intrinsic("llvm.aarch64.neon.sdot.v4i32.v16i8", fnty=ir.FunctionType(v4, [v4, v16i8, v16i8]))
    loads = [{} for _ in wbases]  # per group: its raw 64-byte loads, by offset

    def load(gi, at):
        if at not in loads[gi]:
            wp = builder.bitcast(builder.gep(wbases[gi], [ir.Constant(i64, at)]), v64i8.as_pointer())
            loads[gi][at] = builder.load(wp, align=1)
        return loads[gi][at]

    def quad(gi, q):
        """Group gi's weight bytes of quad q as the dot product takes them."""
        wbase = wbases[gi]
        if bits == 2:
            wb = builder.and_(builder.lshr(load(gi, 64 * (q // 4)), ir.Constant(v64i8, [2 * (q % 4)] * 64)),
                              ir.Constant(v64i8, [3] * 64))
        elif nibbles:
            raw = load(gi, 64 * (q % 4))
            if q >= 4:
                raw = builder.lshr(raw, ir.Constant(v64i8, [4] * 64))
            wb = builder.and_(raw, ir.Constant(v64i8, [15] * 64))
        else:
            wb = load(gi, 64 * q)
        if table is not None:
            wb = _lookup_ir(builder, wb, table)
        if bits in (5, 6) and not HIGH_BITS_AS_MASKS:
            wb = builder.or_(wb, high_field_ir(builder, load(gi, 256 + 64 * (q // 4) * (bits - 5)), q, bits))
        for extra, add in ((5, 16), (6, 32)):
            if bits in (5, 6) and bits >= extra and HIGH_BITS_AS_MASKS:  # the 8-bit format has no mask bytes
                at = 256 + 64 * (extra - 5) + 8 * q
                mp = builder.bitcast(builder.gep(wbase, [ir.Constant(i64, at)]), i64.as_pointer())
                mask = builder.bitcast(builder.load(mp, align=1), ir.VectorType(ir.IntType(1), 64))
                wb = builder.or_(wb, builder.select(mask, ir.Constant(v64i8, [add] * 64), ir.Constant(v64i8, None)))
        if (sdot or avx2) and bits == 8:  # SIGNED_EIGHT: stored q + 128 as u8, xor 0x80 gives q (offset 0)
            wb = builder.xor(wb, ir.Constant(v64i8, [-128] * 64))
        return wb

    pending: dict[tuple[int, int, int], tuple[ir.Value | None, int]] = {}  # AVX2's i16 sums by (group, token, chain)
    order = [0, 4, 1, 5, 2, 6, 3, 7] if nibbles and len(wbases) > 1 else list(range(8))
    for q in order:
        wbs = [quad(gi, q) for gi in range(len(wbases))]
        for u, xoff in enumerate(xoffs):
            xs = builder.load(builder.gep(xbase, [builder.add(xoff, ir.Constant(i64, q))]))
            xv = builder.insert_element(ir.Constant(v16, None), xs, ir.Constant(i32, 0))
            xv = builder.shuffle_vector(xv, ir.Constant(v16, None), ir.Constant(v16, [0] * 16))
            chain = q // 4 if split else q % chains
            for gi, wb in enumerate(wbs):
                a = accs[gi][u][chain]
                wv = builder.bitcast(wb, v16)
                if vnni:
                    a = builder.call(fn, [a, wv, xv])
                elif sdot:
                    a = sdot16_ir(builder, fn, a, wb, xv)
                elif avx2 and eight:  # signed bytes (SIGNED_EIGHT)
                    a = builder.add(a, signed_dot_ir(builder, wb, xv))
                elif avx2:  # pair sums held in i16 for up to I16_QUADS[bits] quads, then widened
                    key = (gi, u, chain)
                    p = maddubs16_ir(builder, wb, xv)
                    held, n = pending.get(key, (None, 0))
                    held, n = (p if held is None else builder.add(held, p)), n + 1
                    if n == I16_QUADS[bits]:
                        a = builder.add(a, widen16_ir(builder, held))
                        held, n = None, 0
                    pending[key] = (held, n)
                else:
                    # vpdpbusd's semantics in plain IR: zext(u8) * sext(s8), sums of 4 adjacent products
                    w32 = builder.zext(builder.bitcast(wv, v64i8), v64i32)
                    x32 = builder.sext(builder.bitcast(xv, v64i8), v64i32)
                    p = builder.mul(w32, x32)
                    for k in range(4):
                        a = builder.add(a, builder.shuffle_vector(p, p, ir.Constant(v16, [4 * j + k for j in range(16)])))
                accs[gi][u][chain] = a
    for (gi, u, chain), (held, _n) in pending.items():  # the i16 sums not yet widened
        if held is not None:
            accs[gi][u][chain] = builder.add(accs[gi][u][chain], widen16_ir(builder, held))
    out = []
    for group in accs:
        if split:
            out.append([a for chain in group for a in chain])
            continue
        sums = []
        for chain in group:
            a = chain[0]
            for b in chain[1:]:
                a = builder.add(a, b)
            sums.append(a)
        out.append(sums)
    return out
