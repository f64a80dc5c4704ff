"""A range of super-blocks (256 columns each) of a K-quant matrix's 16-row group for one, two
or four tokens, as one LLVM IR loop over their 32-column blocks: each block's integer dot
products (kernels_cpu.simd_dot) and float epilogue, the tokens' float accumulators in registers
from the first block to the last (loaded once, stored once). One block per iteration: the 8
blocks of a super-block unrolled made LLVM interleave them and spill ~36 vectors a super-block
(IQ4_XS's GEMM ran 19% slower than the same loop per block). The int8 kernel's tile
(i8_blocks_tile, below) is the same loop over its blocks. A GEMM's four-token tiles run two row
groups at once (k_pair_tile, i8_pair_tile): with one group each vpdpbusd needed its own
broadcast load of the token's quad, and the loads, not the dot products, bound the tile
(1,536 x 8,960 x 512 tokens, 1 thread: Q4_K 182 -> 227 GMAC/s, Q8_0 200 -> 251).

The arithmetic per (token, row lane, block) is exactly kernels_cpu.matmul_k's (the same
operations in the same order: fmul, fmul, fadd, never fused), so a row's bits do not depend on
whether this tile or the per-block path computed it, nor on the batch.

Modes (the epilogue of each block b, for token u with scale dx, sums per 16 lo, hi):
    MODE_MIN   (Q4_K, Q5_K): acc += float(dot) * (ds_b * dx) + ms_b * (dx * float(lo + hi))
    MODE_MIN_INLINE (Q4_K, Q5_K, a few tokens): MODE_MIN with ds_b = float(sc_b) * d and ms_b =
               float(m_b) * -dmin (scale_rows' operations: the same bits) made in the loop from
               the record's header (MIN_HEADER), not read from a scratch slot: a GEMV spent ~25%
               of its time unpacking each super-block's scales into scratch and reading them back
    MODE_SPLIT_INLINE (Q6_K, a few tokens): MODE_SPLIT with d and the scales per 16 read in the
               loop from the record's header (Q6_HEADER), as the scratch slots would hold them
    MODE_SPLIT (Q6_K; the grids with scales per 16 on their staged 8-bit codes, TABLE_OFFSET
               for 32): isum = isc_2b * (dot_lo - 32 lo) + isc_2b+1 * (dot_hi - 32 hi) (exact:
               in float, every value an integer below 2^24); acc += float(isum) * (d * dx)
    MODE_SCALE (IQ4_XS; the grids with scales per 32 on their staged 8-bit codes):
               acc += float(dot - TABLE_OFFSET * (lo + hi)) * (ds_b * dx)
    MODE_TQ    (TQ1_0, TQ2_0): acc += float(dot - (lo + hi)) * (d * dx)
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ._jit import HAS_F16C
from .simd_dot import BLOCK_BYTES, TABLE_OFFSET, dot_blocks_ir
from .simd_isa import HAS_AVX2_DOT, HAS_SDOT, HAS_VNNI, PREFETCH_K_BYTES, PREFETCH_K_GEMV_BYTES

MODE_MIN, MODE_SPLIT, MODE_SCALE, MODE_TQ, MODE_MIN_INLINE, MODE_SPLIT_INLINE = 0, 1, 2, 3, 4, 5
# The record headers (kernels_cpu.repack_k), in bytes before the codes: Q4_K's and Q5_K's d f16
# [16], dmin f16 [16], the sub-block scales sc uint8 [8][16], the mins m uint8 [8][16]; Q6_K's d
# f16 [16], its scales per 16 columns int8 [16][16]
MIN_HEADER, Q6_HEADER = 320, 288
_D_AT, _DMIN_AT, _SC_AT, _M_AT = -320, -288, -256, -128
_Q6_D_AT, _Q6_SC_AT = -288, -256
PREFETCH_SCALES = 128  # the int8 kernel's block scales, this many elements (8 blocks) ahead
_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VI, _VF = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
_VH, _V16I8 = ir.VectorType(ir.HalfType(), 16), ir.VectorType(ir.IntType(8), 16)


def _splat(builder, v, vt):
    one = builder.insert_element(ir.Constant(vt, None), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vt, None), ir.Constant(_VI, [0] * 16))


def _vec_at(builder, base, off, vt):
    return builder.load(builder.bitcast(builder.gep(base, [off]), vt.as_pointer()), align=4)


def _c64(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


def _block_term(builder, isum, dvec, dx, mvec=None, count=None):
    """The one float sequence of a block's contribution to a token's 16 row lanes (the K and
    int8 kernels alike): float(isum) * (d * dx), plus m * (dx * float(count)) with mins; fmul,
    fmul[, fmul, fmul, fadd], never fused. isum: <16 x i32>, or its exact float value."""
    fsum = isum if isum.type == _VF else builder.sitofp(isum, _VF)
    term = builder.fmul(fsum, builder.fmul(dvec, _splat(builder, dx, _VF)))
    if mvec is not None:
        mx = builder.fmul(dx, builder.sitofp(count, _F32))
        term = builder.fadd(term, builder.fmul(mvec, _splat(builder, mx, _VF)))
    return term


# the argument positions of k_super_tile (one row group) and k_pair_tile (two)
_ONE = dict(facc=(0,), w=1, wo=(2,), rec=3, x4=4, xd=5, xs=6, ds=7, ms=8, dtmp=9, isc=10, toks=11, k4=15, nxd=16,
            nxs=17, s0=18, ns=19, j0=(20,))
_TWO = dict(facc=(0, 1), w=2, wo=(3, 4), rec=5, x4=6, xd=7, xs=8, ds=9, ms=10, dtmp=11, isc=12, toks=13, k4=17,
            nxd=18, nxs=19, s0=20, ns=21, j0=(22, 23))


def _literals(mode, bits, ntok):
    lits = (mode, bits, ntok)
    if not all(isinstance(v, types.IntegerLiteral) for v in lits):
        return None
    return tuple(v.literal_value for v in lits)


@intrinsic
def k_super_tile(typingctx, facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0,
                 mode, bits, ntok):
    """facc[16 u + l] += the contribution of super-blocks s0 .. s0 + ns - 1 for token u < ntok (a
    literal: 1, 2 or 4) at row lane l, in order, the accumulators in registers throughout (one
    call per tile and row group, as the int8 kernel's blocks). Super-block s0 + j: its 8 blocks
    of format bits (a literal) at w[wo + j * rec ...] (uint8, after its record's header); its
    scales in scratch slot j0 + j: ds, ms float32, its per-block row scales and negated mins at
    [128 (j0 + j) ...]; dtmp float32, its rows' d at [16 (j0 + j) ...]; isc int32, Q6_K's scales
    per 16 columns at [256 (j0 + j) ...]. x4: int32 flat
    activations, token t's quads at t * k4; xd: float32 flat, t's block scales at t * nxd; xs:
    int32 flat, t's sums per 16 at t * nxs; ta..td the tokens (a short tile repeats its last).
    mode: a literal MODE_*."""
    lits = _literals(mode, bits, ntok)
    if lits is None or not all(isinstance(a, types.Array) for a in (facc, w, x4, xd, xs, ds, ms, dtmp, isc)):
        return None
    sig = types.void(facc, w, wo, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns, j0, mode,
                     bits, ntok)
    return sig, _tile_codegen(_ONE, *lits)


@intrinsic
def k_pair_tile(typingctx, facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs,
                s0, ns, j0, j2, mode, bits, ntok):
    """k_super_tile for two row groups at once, the second's weights from byte wo2, its scales
    in slots j2 + j and its accumulators in facc2: each token's broadcast activations meet both
    groups' weights (a GEMM's tile was bound by its loads, one broadcast per dot product). Each
    row's operations are k_super_tile's, in its order: the same bits."""
    lits = _literals(mode, bits, ntok)
    if lits is None or not all(isinstance(a, types.Array) for a in (facc, facc2, w, x4, xd, xs, ds, ms, dtmp, isc)):
        return None
    sig = types.void(facc, facc2, w, wo, wo2, rec, x4, xd, xs, ds, ms, dtmp, isc, ta, tb, tc, td, k4, nxd, nxs, s0, ns,
                     j0, j2, mode, bits, ntok)
    return sig, _tile_codegen(_TWO, *lits)


def _tile_codegen(at, md, fmt, n):
    """The IR of k_super_tile / k_pair_tile: `at` gives each argument's position (a tuple per
    row group where each group has its own)."""

    def codegen(context, builder, signature, args):
        def data(k):
            return context.make_array(signature.args[k])(context, builder, value=args[k]).data

        def i64(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        wp, xp, xdp, xsp, dsp, msp, dtp, iscp = (data(at[k]) for k in ("w", "x4", "xd", "xs", "ds", "ms", "dtmp", "isc"))
        groups = []  # per row group: its accumulators' pointer, weight offset and scale pointers
        for fk, wk, jk in zip(at["facc"], at["wo"], at["j0"]):  # (wo: the codes of super-block s0)
            slot = i64(jk)  # the scratch slot of super-block s0
            groups.append(dict(
                fp=data(fk), wo=i64(wk), ds=builder.gep(dsp, [builder.mul(slot, _c64(128))]),
                ms=builder.gep(msp, [builder.mul(slot, _c64(128))]), dt=builder.gep(dtp, [builder.mul(slot, _c64(16))]),
                isc=builder.gep(iscp, [builder.mul(slot, _c64(256))])))
        rec64 = i64(at["rec"])
        toks = [i64(at["toks"] + u) for u in range(n)]
        k4v, nxd, nxs, s0v, nsv = (i64(at[k]) for k in ("k4", "nxd", "nxs", "s0", "ns"))
        for g in groups:  # promoted to registers by mem2reg
            g["slots"] = [cgutils.alloca_once(builder, _VF) for _ in range(n)]
            for u in range(n):
                builder.store(_vec_at(builder, g["fp"], _c64(16 * u), _VF), g["slots"][u])
        split = md in (MODE_SPLIT, MODE_SPLIT_INLINE)
        inline = md in (MODE_MIN_INLINE, MODE_SPLIT_INLINE)  # a GEMV's tile
        fma = builder.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF, _VF]))
        # one block per iteration (8 per super-block): a loop body LLVM schedules without spills,
        # where 8 blocks unrolled spilled ~36 vectors a super-block (IQ4_XS ran 19% slower)
        with cgutils.for_range(builder, builder.mul(nsv, _c64(8))) as loop:
            jb = loop.index  # block of the tile's range; its super-block j = jb / 8, block b = jb % 8
            j = builder.lshr(jb, _c64(3))
            gb = builder.add(builder.mul(s0v, _c64(8)), jb)  # the block's index in the activations
            inner = builder.add(builder.mul(j, rec64), builder.mul(builder.and_(jb, _c64(7)), _c64(BLOCK_BYTES[fmt])))
            wbs = [builder.gep(wp, [builder.add(g["wo"], inner)]) for g in groups]
            for g in groups:  # the codes of the block's super-block (its header is before them)
                g["codes"] = builder.gep(wp, [builder.add(g["wo"], builder.mul(j, rec64))])
            xoffs = [builder.add(builder.mul(t, k4v), builder.mul(gb, _c64(8))) for t in toks]
            all_sums = dot_blocks_ir(builder, wbs, xp, xoffs, HAS_VNNI, fmt, split, HAS_SDOT, HAS_AVX2_DOT,
                                     PREFETCH_K_GEMV_BYTES if inline else PREFETCH_K_BYTES)
            xterms = []  # per token: its block scale and sums per 16 (shared by the groups)
            for u in range(n):
                dx = builder.load(builder.gep(xdp, [builder.add(builder.mul(toks[u], nxd), gb)]))
                sat = builder.add(builder.mul(toks[u], nxs), builder.mul(gb, _c64(2)))
                lo = builder.load(builder.gep(xsp, [sat]))
                hi = builder.load(builder.gep(xsp, [builder.add(sat, _c64(1))]))
                xterms.append((dx, lo, hi))
            for g, sums in zip(groups, all_sums):
                _block_terms(builder, g, sums, xterms, jb, j, md, fmt, fma)
        for g in groups:
            for u in range(n):
                builder.store(builder.load(g["slots"][u]),
                              builder.bitcast(builder.gep(g["fp"], [_c64(16 * u)]), _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _block_terms(builder, g, sums, xterms, jb, j, md, fmt, fma):
    """Block jb's epilogue for one row group g (its scales and accumulator slots) and every
    token (xterms: dx, lo, hi), by mode (the module docstring)."""
    split = md in (MODE_SPLIT, MODE_SPLIT_INLINE)
    dvec = _vec_at(builder, g["dt"], builder.mul(j, _c64(16)), _VF) if md in (MODE_SPLIT, MODE_TQ) else None
    if md == MODE_MIN_INLINE:
        dsb, msb = _inline_min_scales(builder, g["codes"], builder.and_(jb, _c64(7)))
    if md == MODE_SPLIT_INLINE:  # Q6_K's d and scales per 16 from the header, as floats
        b32 = builder.mul(builder.and_(jb, _c64(7)), _c64(32))
        dvec = _halves_to_float(builder, g["codes"], _c64(_Q6_D_AT))
        s_lo, s_hi = (builder.sitofp(builder.sext(_header_vec(builder, g["codes"], builder.add(b32, _c64(o)), _V16I8), _VI),
                                     _VF) for o in (_Q6_SC_AT, _Q6_SC_AT + 16))
    elif split:  # Q6_K's scales per 16 as floats, once for the tile's tokens
        s_lo = builder.sitofp(_vec_at(builder, g["isc"], builder.mul(jb, _c64(32)), _VI), _VF)
        s_hi = builder.sitofp(_vec_at(builder, g["isc"], builder.add(builder.mul(jb, _c64(32)), _c64(16)), _VI), _VF)
    for u, (dx, lo, hi) in enumerate(xterms):
        if split:  # Q6_K: isum = sc_lo * (dot_lo - 32 lo) + sc_hi * (dot_hi - 32 hi), computed in
            # float but exact: |dot - 32 xs| <= 16 * 32 * 127 and |sc| <= 128, so each product
            # and the sum stay below 2^24 (float(isum) to the bit, without vpmulld's two uops);
            # the grids: |value| <= 43 (IQ2_S's largest) and sc <= 31 keep the same bound
            off = ir.Constant(_I32, 32 if fmt == 6 else TABLE_OFFSET)
            a_lo = builder.sitofp(builder.sub(sums[2 * u], _splat(builder, builder.mul(off, lo), _VI)), _VF)
            a_hi = builder.sitofp(builder.sub(sums[2 * u + 1], _splat(builder, builder.mul(off, hi), _VI)), _VF)
            term = _block_term(builder, builder.call(fma, [a_lo, s_lo, builder.fmul(a_hi, s_hi)]), dvec, dx)
        elif md == MODE_TQ:
            term = _block_term(builder, builder.sub(sums[u], _splat(builder, builder.add(lo, hi), _VI)), dvec, dx)
        else:
            isum = sums[u]
            if md == MODE_SCALE:
                corr = builder.mul(ir.Constant(_I32, TABLE_OFFSET), builder.add(lo, hi))
                isum = builder.sub(isum, _splat(builder, corr, _VI))
            if md != MODE_MIN_INLINE:
                dsb = _vec_at(builder, g["ds"], builder.mul(jb, _c64(16)), _VF)
                msb = _vec_at(builder, g["ms"], builder.mul(jb, _c64(16)), _VF) if md == MODE_MIN else None
            term = _block_term(builder, isum, dsb, dx, msb, builder.add(lo, hi))
        slot = g["slots"][u]
        builder.store(builder.fadd(builder.load(slot), term), slot)


def _halves_to_float(builder, codes, off):
    """16 f16 values at byte off from the codes' i8 pointer as <16 x float>, exactly: fpext
    (vcvtph2ps) with F16C; elsewhere (LLVM would call __extendhfsf2, which numba's JIT cannot
    link) the magnitude's bits shifted into a float's and scaled by 2^112, subnormals included,
    the sign put back (a scale is never inf or nan)."""
    if HAS_F16C:
        return builder.fpext(_header_vec(builder, codes, off, _VH), _VF)
    h = builder.zext(_header_vec(builder, codes, off, ir.VectorType(ir.IntType(16), 16)), _VI)
    mag = builder.bitcast(builder.shl(builder.and_(h, ir.Constant(_VI, [0x7FFF] * 16)), ir.Constant(_VI, [13] * 16)), _VF)
    mag = builder.bitcast(builder.fmul(mag, ir.Constant(_VF, [2.0**112] * 16)), _VI)
    sign = builder.shl(builder.and_(h, ir.Constant(_VI, [0x8000] * 16)), ir.Constant(_VI, [16] * 16))
    return builder.bitcast(builder.or_(mag, sign), _VF)


def _header_vec(builder, codes, off, vt):
    """The vector vt at byte off (an i64 value, negative: the header) from the codes' i8 pointer."""
    return builder.load(builder.bitcast(builder.gep(codes, [off]), vt.as_pointer()), align=1)


def _inline_min_scales(builder, codes, b):
    """Block b's row scales (d * sc_b, -dmin * m_b) <16 x float> from the header before the
    super-block's codes (an i8 pointer): scale_rows' operations (sitofp, fmul by d or by -dmin)."""
    d = _halves_to_float(builder, codes, _c64(_D_AT))
    dmin = builder.fneg(_halves_to_float(builder, codes, _c64(_DMIN_AT)))
    row = builder.mul(b, _c64(16))
    sc, m = (builder.sitofp(builder.zext(_header_vec(builder, codes, builder.add(row, _c64(o)), _V16I8), _VI), _VF)
             for o in (_SC_AT, _M_AT))
    return builder.fmul(sc, d), builder.fmul(m, dmin)


# the argument positions of i8_blocks_tile (one row group) and i8_pair_tile (two)
_I8_ONE = dict(facc=(0,), w=1, wo=(2,), x4=3, xd=4, xs=5, wd=6, wm=7, so=(8,), nb=9, toks=10, k4=14, corr=15)
_I8_TWO = dict(facc=(0, 1), w=2, wo=(3, 4), x4=5, xd=6, xs=7, wd=8, wm=9, so=(10, 11), nb=12, toks=13, k4=17, corr=18)


def _i8_literals(with_min, fmt, ntok):
    lits = (fmt, ntok)
    if not all(isinstance(v, types.IntegerLiteral) for v in lits) or not isinstance(with_min, types.BooleanLiteral):
        return None
    return fmt.literal_value, ntok.literal_value, with_min.literal_value


@intrinsic
def i8_blocks_tile(typingctx, facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, with_min, fmt, ntok):
    """The int8 kernel's (kernels_cpu.matmul_i8) blocks 0..nb - 1 (all of them) of a 16-row group for token
    u < ntok (a literal: 1, 2 or 4), added to facc[16 u + l] as that kernel's per-block epilogue
    does, in the same operations and order, block by block:
        acc += float(dot - corr * xs) * (d * dx) [+ m * (dx * float(xs))]
    w: uint8, block b at w[wo + b * BLOCK_BYTES[fmt]] (fmt a literal); wd, wm: uint16 f16 bits,
    block b's 16 row scales (mins) at so + 16 b (wm read only when with_min, a literal bool);
    x4 int32, xd float32, xs int32: token t's quads at t * k4, its scales and sums at t * nb.
    Only for F16C targets (the scales are converted as a vector)."""
    lits = _i8_literals(with_min, fmt, ntok)
    if lits is None or not all(isinstance(a, types.Array) for a in (facc, w, x4, xd, xs, wd, wm)):
        return None
    sig = types.void(facc, w, wo, x4, xd, xs, wd, wm, so, nb, ta, tb, tc, td, k4, corr, with_min, fmt, ntok)
    return sig, _i8_codegen(_I8_ONE, *lits)


@intrinsic
def i8_pair_tile(typingctx, facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr,
                 with_min, fmt, ntok):
    """i8_blocks_tile for two row groups at once (the second's blocks from byte wo2, its scales
    at so2, its accumulators in facc2), each token's broadcast quads meeting both groups'
    weights, as k_pair_tile: each row's operations in i8_blocks_tile's order, the same bits."""
    lits = _i8_literals(with_min, fmt, ntok)
    if lits is None or not all(isinstance(a, types.Array) for a in (facc, facc2, w, x4, xd, xs, wd, wm)):
        return None
    sig = types.void(facc, facc2, w, wo, wo2, x4, xd, xs, wd, wm, so, so2, nb, ta, tb, tc, td, k4, corr, with_min, fmt,
                     ntok)
    return sig, _i8_codegen(_I8_TWO, *lits)


def _i8_codegen(at, fm, n, mins):
    """The IR of i8_blocks_tile / i8_pair_tile (`at`: the arguments' positions, as _tile_codegen)."""
    vh = ir.VectorType(ir.HalfType(), 16)

    def codegen(context, builder, signature, args):
        def data(k):
            return context.make_array(signature.args[k])(context, builder, value=args[k]).data

        def i64(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        wp, xp, xdp, xsp, wdp, wmp = (data(at[k]) for k in ("w", "x4", "xd", "xs", "wd", "wm"))
        nbv, k4v = i64(at["nb"]), i64(at["k4"])
        corr32 = context.cast(builder, args[at["corr"]], signature.args[at["corr"]], types.int32)
        toks = [i64(at["toks"] + u) for u in range(n)]
        groups = [dict(fp=data(fk), wo=i64(wk), so=i64(sk)) for fk, wk, sk in zip(at["facc"], at["wo"], at["so"])]
        for g in groups:  # promoted to registers by mem2reg
            g["slots"] = [cgutils.alloca_once(builder, _VF) for _ in range(n)]
            for u in range(n):
                builder.store(_vec_at(builder, g["fp"], _c64(16 * u), _VF), g["slots"][u])
        i8p = ir.IntType(8).as_pointer()
        pf = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, _I32, _I32, _I32]))
        with cgutils.for_range(builder, nbv) as loop:
            b = loop.index
            wbs = [builder.gep(wp, [builder.add(g["wo"], builder.mul(b, _c64(BLOCK_BYTES[fm])))]) for g in groups]
            xoffs = [builder.add(builder.mul(t, k4v), builder.mul(b, _c64(8))) for t in toks]
            all_sums = dot_blocks_ir(builder, wbs, xp, xoffs, HAS_VNNI, fm, False, HAS_SDOT, HAS_AVX2_DOT)
            xterms = []
            for u in range(n):
                xat = builder.add(builder.mul(toks[u], nbv), b)
                xterms.append((builder.load(builder.gep(xdp, [xat])), builder.load(builder.gep(xsp, [xat]))))
            for g, sums in zip(groups, all_sums):
                soff = builder.add(g["so"], builder.mul(b, _c64(16)))
                for arr in (wdp, wmp) if mins else (wdp,):  # the scales' stream, 8 blocks ahead
                    ahead = builder.bitcast(builder.gep(arr, [builder.add(soff, _c64(PREFETCH_SCALES))]), i8p)
                    builder.call(pf, [ahead, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
                dvec = builder.fpext(_vec_at(builder, wdp, soff, vh), _VF)
                mvec = builder.fpext(_vec_at(builder, wmp, soff, vh), _VF) if mins else None
                for u, (dx, x_sum) in enumerate(xterms):
                    isum = builder.sub(sums[u], _splat(builder, builder.mul(corr32, x_sum), _VI))
                    term = _block_term(builder, isum, dvec, dx, mvec, x_sum)
                    builder.store(builder.fadd(builder.load(g["slots"][u]), term), g["slots"][u])
        for g in groups:
            for u in range(n):
                builder.store(builder.load(g["slots"][u]),
                              builder.bitcast(builder.gep(g["fp"], [_c64(16 * u)]), _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen
