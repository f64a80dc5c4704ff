"""The int8 matmul's vector code, written as LLVM IR intrinsics (numba's own code generation
left these loops scalar or gathered): one 16-row x 32-column block's dot products for one or
four tokens (the IR itself, per instruction set and code format, is kernels_cpu.simd_dot's), the
per-block float epilogue, and the conversion of a block's 16 f16 scales. The layouts are drawn
in kernels_cpu.matmul_i8."""

from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from ._jit import HAS_F16C, f16_to_f32, kernel
from .simd_dot import (
    BLOCK_BYTES,
    FMT_IQ1_M,
    FMT_IQ1_S,
    FMT_IQ2_S,
    FMT_IQ2_XS,
    FMT_IQ2_XXS,
    FMT_IQ3_S,
    FMT_IQ3_XXS,
    FMT_IQ4,
    FMT_MXFP4,
    dot_block_ir,
    grid_quads_ir,
)
from .simd_isa import HAS_AVX2_DOT, HAS_SDOT, HAS_VNNI

GROUP = 16  # rows per interleaved group (one 512-bit vector of int32 lanes)
def _dot_codegen(n_tokens, bits, split=False):
    def codegen(context, builder, signature, args):
        acc_a = context.make_array(signature.args[0])(context, builder, value=args[0])
        w_a = context.make_array(signature.args[1])(context, builder, value=args[1])
        x_a = context.make_array(signature.args[3])(context, builder, value=args[3])
        v16 = ir.VectorType(ir.IntType(32), 16)
        xoffs = [context.cast(builder, args[4 + u], signature.args[4 + u], types.int64) for u in range(n_tokens)]
        woff = context.cast(builder, args[2], signature.args[2], types.int64)
        sums = dot_block_ir(builder, builder.gep(w_a.data, [woff]), x_a.data, xoffs, HAS_VNNI, bits, split, HAS_SDOT,
                             HAS_AVX2_DOT)
        for u, a in enumerate(sums):
            dst = builder.gep(acc_a.data, [ir.Constant(ir.IntType(64), 16 * u)])
            builder.store(a, builder.bitcast(dst, v16.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _arrays(*ts) -> bool:
    return all(isinstance(t, types.Array) for t in ts)


def _dot1(bits, doc, split=False):
    def dot(typingctx, iacc, w, w_off, x4, x_off):
        if not _arrays(iacc, w, x4):
            return None
        return types.void(iacc, w, w_off, x4, x_off), _dot_codegen(1, bits, split)

    dot.__doc__ = doc
    return intrinsic(dot)


def _dot4(bits, doc, split=False):
    def dot(typingctx, iacc, w, w_off, x4, xo0, xo1, xo2, xo3):
        if not _arrays(iacc, w, x4):
            return None
        return types.void(iacc, w, w_off, x4, xo0, xo1, xo2, xo3), _dot_codegen(4, bits, split)

    dot.__doc__ = doc
    return intrinsic(dot)


# dot_block*(iacc, w, w_off, x4, x_off): iacc[0:16] = sum over quads q of 4-byte dot products of
# the block's u8 codes at w[w_off...] (quad q, row lane l, byte k) with s8 x4[x_off + q] (4 packed
# int8), for the 16 row lanes. dot_block4*(iacc, w, w_off, x4, xo0, .., xo3): the same for
# TOKEN_TILE = 4 tokens, token u in iacc[16u:16u+16], bit-identical to dot_block's. iacc: int32;
# w: uint8; x4: int32 (flat arrays). One pair per weight format (bits, or a table format).
dot_block = _dot1(8, "8-bit format, one token")
dot_block4 = _dot4(8, "8-bit format, four tokens")
dot_block_q4 = _dot1(4, "4-bit format, one token")
dot_block4_q4 = _dot4(4, "4-bit format, four tokens")
dot_block_q5 = _dot1(5, "5-bit format, one token")
dot_block4_q5 = _dot4(5, "5-bit format, four tokens")
# 6-bit format, split in halves: iacc[32u:32u+16] columns 0-15, iacc[32u+16:32u+32] 16-31 of token u
dot_block_q6 = _dot1(6, "6-bit format, one token, two half-block sums", split=True)
dot_block4_q6 = _dot4(6, "6-bit format, four tokens, two half-block sums each", split=True)
dot_block_q2 = _dot1(2, "2-bit format, one token")
dot_block4_q2 = _dot4(2, "2-bit format, four tokens")
dot_block_iq4 = _dot1(FMT_IQ4, "4-bit codes through IQ4_NL's table, one token")
dot_block4_iq4 = _dot4(FMT_IQ4, "4-bit codes through IQ4_NL's table, four tokens")
dot_block_fp4 = _dot1(FMT_MXFP4, "4-bit codes through MXFP4's table, one token")
dot_block4_fp4 = _dot4(FMT_MXFP4, "4-bit codes through MXFP4's table, four tokens")
# the 8-bit format split in halves, as k_super_tile reads a grid block staged with scales per
# 16 (grid_stage); named here for the assembly checks
dot_block_q8s = _dot1(8, "8-bit format, one token, two half-block sums", split=True)


def _stage(fmt, doc):
    def stage(typingctx, dst, do, w, wo):
        if not _arrays(dst, w):
            return None

        def codegen(context, builder, signature, args):
            d = context.make_array(signature.args[0])(context, builder, value=args[0])
            wa = context.make_array(signature.args[2])(context, builder, value=args[2])
            dof, wof = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 3))
            v64i8 = ir.VectorType(ir.IntType(8), 64)
            base = builder.gep(d.data, [dof])
            for q, wb in enumerate(grid_quads_ir(builder, builder.gep(wa.data, [wof]), fmt, False)):
                at = builder.gep(base, [ir.Constant(ir.IntType(64), 64 * q)])
                builder.store(wb, builder.bitcast(at, v64i8.as_pointer()), align=1)
            return context.get_dummy_value()

        return types.void(dst, do, w, wo), codegen

    stage.__doc__ = doc
    return intrinsic(stage)


# stage_*(dst, do, w, wo): the grid block at w[wo...] as the 8-bit format's block (v + 128) at
# dst[do:do + 512], which the 8-bit format's dot products then read: one token's or four's, or
# a GEMM's whole chunk of tokens at one decode
stage_iq2xxs = _stage(FMT_IQ2_XXS, "IQ2_XXS's block as 8-bit codes")
stage_iq2xs = _stage(FMT_IQ2_XS, "IQ2_XS's block as 8-bit codes")
stage_iq2s = _stage(FMT_IQ2_S, "IQ2_S's block as 8-bit codes")
stage_iq3xxs = _stage(FMT_IQ3_XXS, "IQ3_XXS's block as 8-bit codes")
stage_iq3s = _stage(FMT_IQ3_S, "IQ3_S's block as 8-bit codes")
stage_iq1 = _stage(FMT_IQ1_S, "IQ1_S's or IQ1_M's block (the same layout) as 8-bit codes")
_BLOCK_BYTES = tuple(BLOCK_BYTES.get(f, 0) for f in range(max(BLOCK_BYTES) + 1))


@kernel(inline=True)
def block_bytes(fmt):
    """Bytes of one 16-row x 32-column block in format fmt (BLOCK_BYTES, inside kernels)."""
    return _BLOCK_BYTES[fmt]


@kernel(inline=True)
def dot_tile4(bits, iacc, w, wo, x4, xa, xb, xc, xd):
    """The block's dot products for the four tokens at x4 offsets xa..xd (one weight load each;
    an offset may repeat, padding a short tile: each token's integers are its own either way)."""
    if bits == 8:
        dot_block4(iacc, w, wo, x4, xa, xb, xc, xd)
    elif bits == 4:
        dot_block4_q4(iacc, w, wo, x4, xa, xb, xc, xd)
    elif bits == 5:
        dot_block4_q5(iacc, w, wo, x4, xa, xb, xc, xd)
    elif bits == 2:
        dot_block4_q2(iacc, w, wo, x4, xa, xb, xc, xd)
    elif bits == FMT_IQ4:
        dot_block4_iq4(iacc, w, wo, x4, xa, xb, xc, xd)
    elif bits == FMT_MXFP4:
        dot_block4_fp4(iacc, w, wo, x4, xa, xb, xc, xd)
    else:
        dot_block4_q6(iacc, w, wo, x4, xa, xb, xc, xd)


@kernel(inline=True)
def dot_tile(n, bits, iacc, w, wo, x4, x0, k4):
    """The block's dot products for n tokens (n = 4: the tokens at x0, x0 + k4, ..., one weight
    load each; otherwise the one at x0), in the format of `bits` (8, 4, 5, 6 split, 2, or a
    table format)."""
    if n == 4:
        dot_tile4(bits, iacc, w, wo, x4, x0, x0 + k4, x0 + 2 * k4, x0 + 3 * k4)
    elif bits == 8:
        dot_block(iacc, w, wo, x4, x0)
    elif bits == 4:
        dot_block_q4(iacc, w, wo, x4, x0)
    elif bits == 5:
        dot_block_q5(iacc, w, wo, x4, x0)
    elif bits == 2:
        dot_block_q2(iacc, w, wo, x4, x0)
    elif bits == FMT_IQ4:
        dot_block_iq4(iacc, w, wo, x4, x0)
    elif bits == FMT_MXFP4:
        dot_block_fp4(iacc, w, wo, x4, x0)
    else:
        dot_block_q6(iacc, w, wo, x4, x0)


@kernel(inline=True)
def grid_stage(fmt, dst, do, w, wo):
    """The grid block of format fmt at w[wo...] staged as the 8-bit format's 512 bytes at dst[do:]."""
    if fmt == FMT_IQ2_XXS:
        stage_iq2xxs(dst, do, w, wo)
    elif fmt == FMT_IQ2_XS:
        stage_iq2xs(dst, do, w, wo)
    elif fmt == FMT_IQ2_S:
        stage_iq2s(dst, do, w, wo)
    elif fmt == FMT_IQ3_XXS:
        stage_iq3xxs(dst, do, w, wo)
    elif fmt == FMT_IQ1_S or fmt == FMT_IQ1_M:
        stage_iq1(dst, do, w, wo)
    else:
        stage_iq3s(dst, do, w, wo)


def _accumulate_codegen(with_min):
    def codegen(context, builder, signature, args):
        i32, f32 = ir.IntType(32), ir.FloatType()
        vi, vf = ir.VectorType(i32, 16), ir.VectorType(f32, 16)

        def ptr(k, off_arg, vt):
            a = context.make_array(signature.args[k])(context, builder, value=args[k])
            off = context.cast(builder, args[off_arg], signature.args[off_arg], types.int64)
            return builder.bitcast(builder.gep(a.data, [off]), vt.as_pointer())

        def splat(k, vt, ty):
            v = context.cast(builder, args[k], signature.args[k], ty)
            one = builder.insert_element(ir.Constant(vt, None), v, ir.Constant(i32, 0))
            return builder.shuffle_vector(one, ir.Constant(vt, None), ir.Constant(vi, [0] * 16))

        fp, ip, wp = ptr(0, 1, vf), ptr(2, 3, vi), ptr(5, 6, vf)
        isum = builder.sub(builder.load(ip, align=4), splat(4, vi, types.int32))
        term = builder.fmul(builder.sitofp(isum, vf), builder.fmul(builder.load(wp, align=4), splat(7, vf, types.float32)))
        if with_min:
            mp = ptr(8, 6, vf)
            term = builder.fadd(term, builder.fmul(builder.load(mp, align=4), splat(9, vf, types.float32)))
        builder.store(builder.fadd(builder.load(fp, align=4), term), fp, align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def scale_accumulate(typingctx, facc, fo, iacc, io, corr, wd, wo, dx):
    """facc[fo + l] += float32(iacc[io + l] - corr) * (wd[wo + l] * dx) for the 16 lanes l, as
    one vector sequence (fmul, fmul, fadd: never fused). facc, wd: float32 [...]; iacc: int32
    [...]; corr: int32; dx: float32. LLVM left the same lines of numba code scalar."""
    if not _arrays(facc, iacc, wd):
        return None
    return types.void(facc, fo, iacc, io, corr, wd, wo, dx), _accumulate_codegen(False)


@intrinsic
def scale_min_accumulate(typingctx, facc, fo, iacc, io, corr, wd, wo, dx, wm, mx):
    """scale_accumulate plus a per-row min term: facc[fo + l] += (float32(iacc[io + l] - corr)
    * (wd[wo + l] * dx) + wm[wo + l] * mx); mx = dx * float32(sum of the token's block)."""
    if not _arrays(facc, iacc, wd, wm):
        return None
    return types.void(facc, fo, iacc, io, corr, wd, wo, dx, wm, mx), _accumulate_codegen(True)


@intrinsic
def _f16x16_to_f32(typingctx, dst, src, off, to):
    """dst[to:to + 16] = the f16 values whose bits are src.flat[off:off + 16] (one vcvtph2ps);
    dst: float32, src: uint16."""
    if not _arrays(dst, src) or dst.dtype != types.float32 or src.dtype != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, value=args[0])
        s = context.make_array(signature.args[1])(context, builder, value=args[1])
        o = context.cast(builder, args[2], signature.args[2], types.int64)
        t = context.cast(builder, args[3], signature.args[3], types.int64)
        vh, vf = ir.VectorType(ir.HalfType(), 16), ir.VectorType(ir.FloatType(), 16)
        h = builder.load(builder.bitcast(builder.gep(s.data, [o]), vh.as_pointer()), align=2)
        builder.store(builder.fpext(h, vf), builder.bitcast(builder.gep(d.data, [t]), vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(dst, src, off, to), codegen


@kernel(inline=True)
def _scales_vector(flat, so, tmp, to):
    _f16x16_to_f32(tmp, flat, so, to)


@kernel(inline=True)
def _scales_scalar(flat, so, tmp, to):
    for ln in range(GROUP):
        tmp[to + ln] = f16_to_f32(flat[so + ln])


# block_scales(flat, so, tmp, to): tmp[to:to + 16] = a block's 16 f16 scales (bits at flat[so:]) as float32,
# once per block for all its tokens: one vector conversion on F16C targets (elsewhere LLVM would
# call compiler-rt's __extendhfsf2, which numba's JIT cannot resolve)
block_scales = _scales_vector if HAS_F16C else _scales_scalar


@kernel(inline=True)
def store_tile(out, facc, t, n, g):
    """out[t + u, 16 g + l] = facc[16 u + l] for a tile's n tokens and row group g's rows (the
    int8 kernels' results). A whole group copies 16 rows at a fixed count, as vector stores:
    the general loop stored a float at a time, ~1.5 ns each, a quarter of a 512-token GEMM."""
    R = out.shape[1]
    r0 = g * GROUP
    if R - r0 >= GROUP:
        for u in range(n):
            for ln in range(GROUP):
                out[t + u, r0 + ln] = facc[u * GROUP + ln]
    else:
        for u in range(n):
            for ln in range(R - r0):
                out[t + u, r0 + ln] = facc[u * GROUP + ln]
