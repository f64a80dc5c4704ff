"""The int8 matmul's vector code, written as LLVM IR intrinsics (numba's own code generation
left these loops scalar or gathered): one 16-row x 32-column block's u8 x s8 dot products
(AVX-512 VNNI `vpdpbusd`; on aarch64 CPUs with the dot-product extension `sdot`, whose signed
bytes hold the 4-, 5- and 6-bit codes as they are and Q8_0's q + 128 as q after xor 0x80; on
other x86 CPUs with AVX2 `vpmaddubsw` + `vpmaddwd`; or plain vector IR that LLVM lowers for any
target, all with the same exact integer sums), the per-block float epilogue, and the conversion
of a block's 16 f16 scales. The layouts are drawn in kernels_cpu.matmul_i8."""

from __future__ import annotations

import platform

from llvmlite import ir
from numba.core import config, types
from numba.extending import intrinsic

from ._jit import HAS_F16C, f16_to_f32, kernel, target_has

GROUP = 16  # rows per interleaved group (one 512-bit vector of int32 lanes)
# Software prefetch distance (measured on the 2-core AVX-512 VM: a streamed GEMV ran at 9 of
# the core's 14 GB/s with the hardware prefetcher alone, 12-13 with these).
PREFETCH_BYTES = 2048  # ahead of the quad being read, in the interleaved weights
HAS_VNNI = target_has("+avx512vnni") and target_has("+avx512bw")
# AVX2 without VNNI: vpmaddubsw (u8 x s8 pairs to saturating i16) then vpmaddwd by ones (i16
# pairs to i32), llama.cpp's idiom; LLVM lowers the plain-IR form to widening multiplies and
# lane shuffles, ~8x slower on a 2-core AVX2 VM.
HAS_AVX2_DOT = not HAS_VNNI and platform.machine().lower() in ("x86_64", "amd64") and target_has("+avx2")
# LLVM CPU names (aarch64) with the dot-product extension (Armv8.2-A dotprod, standard from
# Armv8.4-A): the target-feature list does not show it even on a Raspberry Pi 5, and LLVM
# aborts on the sdot intrinsic for a CPU without it, so the CPU name decides.
DOTPROD_CPUS = frozenset({
    "cortex-a55", "cortex-a65", "cortex-a65ae", "cortex-a75", "cortex-a76", "cortex-a76ae", "cortex-a77",
    "cortex-a78", "cortex-a78ae", "cortex-a78c", "cortex-a510", "cortex-a520", "cortex-a520ae", "cortex-a710",
    "cortex-a715", "cortex-a720", "cortex-a720ae", "cortex-a725", "cortex-x1", "cortex-x1c", "cortex-x2",
    "cortex-x3", "cortex-x4", "cortex-x925", "neoverse-e1", "neoverse-n1", "neoverse-n2", "neoverse-n3",
    "neoverse-v1", "neoverse-v2", "neoverse-v3", "neoverse-v3ae", "neoverse-512tvb", "ampere1", "ampere1a",
    "ampere1b", "apple-a13", "apple-a14", "apple-a15", "apple-a16", "apple-a17", "apple-m1", "apple-m2",
    "apple-m3", "apple-m4", "exynos-m4", "exynos-m5", "saphira", "tsv110", "oryon-1", "grace", "kryo", "carmel",
})


def _has_sdot() -> bool:
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return False
    if target_has("+dotprod"):
        return True
    if config.CPU_NAME:  # type: ignore[attr-defined]
        return str(config.CPU_NAME).lower() in DOTPROD_CPUS  # type: ignore[attr-defined]
    import llvmlite.binding as llvm

    return str(llvm.get_host_cpu_name()).lower() in DOTPROD_CPUS


HAS_SDOT = _has_sdot()
BLOCK_BYTES = {8: 512, 4: 256, 5: 320, 6: 384}  # bytes of one 16-row x 32-column block, per format


def _sdot16(builder, fn, a, wb, xv):
    """vpdpbusd's lanes with aarch64 sdot (signed bytes): a <16 x i32> += for each lane l the
    dot product of bytes 4l..4l+3 of wb <64 x i8> with the 4 bytes of x (xv: one i32 quad
    splatted). Four sdot of 16 bytes each; lane 4k + j of the result is lane j of the k-th."""
    i32, v4 = ir.IntType(32), ir.VectorType(ir.IntType(32), 4)
    xb = builder.bitcast(xv, ir.VectorType(ir.IntType(8), 64))
    x16 = builder.shuffle_vector(xb, xb, ir.Constant(ir.VectorType(i32, 16), list(range(16))))
    parts = []
    for k in range(4):
        ak = builder.shuffle_vector(a, a, ir.Constant(v4, [4 * k + j for j in range(4)]))
        wk = builder.shuffle_vector(wb, wb, ir.Constant(ir.VectorType(i32, 16), [16 * k + j for j in range(16)]))
        parts.append(builder.call(fn, [ak, wk, x16]))
    lo = builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(i32, 8), list(range(8))))
    hi = builder.shuffle_vector(parts[2], parts[3], ir.Constant(ir.VectorType(i32, 8), list(range(8))))
    return builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(i32, 16), list(range(16))))


def _maddubs_ir(builder, wb, xv):
    """vpdpbusd's <16 x i32> lane sums (zext(u8) * sext(s8) of 4 adjacent bytes) with AVX2:
    vpmaddubsw then vpmaddwd by ones on each 32-byte half. vpmaddubsw saturates a pair's i16
    sum, which codes below 64 (the 4-, 5- and 6-bit formats) never reach with |x| <= 128;
    8-bit codes are split into their low 7 bits and their top bit (0 or 128), each pair
    sum then within +-32768, so every lane is the exact integer."""
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    v32i8, v16i16, v8i32, v64i8 = (ir.VectorType(i8, 32), ir.VectorType(i16, 16), ir.VectorType(i32, 8),
                                   ir.VectorType(i8, 64))
    maddubs = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    ones = ir.Constant(v16i16, [1] * 16)
    xb = builder.bitcast(xv, v64i8)

    def half(v, h):
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 32), list(range(32 * h, 32 * h + 32))))

    parts = [builder.call(maddwd, [builder.call(maddubs, [half(wb, h), half(xb, h)]), ones]) for h in (0, 1)]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(i32, 16), list(range(16))))


def _dot_block_ir(builder, wbase, xbase, xoffs, vnni, bits, split=False, sdot=False, avx2=False):
    """int32 <16 x i32> sums of one block for each x offset in xoffs: every weight quad is
    loaded once and meets each token's broadcast quad. Integer sums are exact, so how the
    products are split into chains changes no result: one token uses two chains (even and odd
    quads) to hide vpdpbusd's latency; several tokens are independent chains already.
    bits: the weight format, 8 (one byte per weight), 4 (4 loads, each giving quad q in its low
    and q + 4 in its high nibbles) or 5 (the 4-bit nibbles plus, per quad, a 64-bit mask of
    the fifth bits: bit 4l + k adds 16 to byte 4l + k) or 6 (the 5-bit format plus, per quad, a
    64-bit mask of the sixth bits at 320 + 8q, adding 32). split: two sums per token, quads
    0-3 (columns 0-15) and 4-7 (columns 16-31), for weights with a scale per 16 columns (Q6_K)."""
    nibbles = bits != 8
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v16, v64i8, v64i32 = ir.VectorType(i32, 16), ir.VectorType(i8, 64), ir.VectorType(i32, 64)
    zero = ir.Constant(v16, None)
    chains = 2 if len(xoffs) == 1 or split else 1
    accs = [[zero] * chains for _ in xoffs]
    pf = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i32, i32, i32]))
    for line in range(BLOCK_BYTES[bits] // 64):  # the block's cache lines, PREFETCH_BYTES ahead (read, keep, data)
        ahead = builder.gep(wbase, [ir.Constant(i64, PREFETCH_BYTES + 64 * line)])
        builder.call(pf, [ahead, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
    fn = None
    if vnni:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(v16, [v16, v16, v16]))
    elif sdot:
        v4, v16i8 = ir.VectorType(i32, 4), ir.VectorType(i8, 16)
        fn = builder.module.declare_intrinsic("llvm.aarch64.neon.sdot.v4i32.v16i8", fnty=ir.FunctionType(v4, [v4, v16i8, v16i8]))
    high: list = []
    for q in range(8):
        if nibbles and q >= 4:
            wb = high[q - 4]
        else:
            wp = builder.bitcast(builder.gep(wbase, [ir.Constant(i64, 64 * q)]), v64i8.as_pointer())
            wb = builder.load(wp, align=1)
            if nibbles:
                high.append(builder.lshr(wb, ir.Constant(v64i8, [4] * 64)))
                wb = builder.and_(wb, ir.Constant(v64i8, [15] * 64))
        for extra, add in ((5, 16), (6, 32)):
            if bits in (5, 6) and bits >= extra:  # the 8-bit format has no mask bytes
                at = 256 + 64 * (extra - 5) + 8 * q
                mp = builder.bitcast(builder.gep(wbase, [ir.Constant(i64, at)]), i64.as_pointer())
                mask = builder.bitcast(builder.load(mp, align=1), ir.VectorType(ir.IntType(1), 64))
                wb = builder.or_(wb, builder.select(mask, ir.Constant(v64i8, [add] * 64), ir.Constant(v64i8, None)))
        if sdot and bits == 8:  # stored q + 128 as u8: xor 0x80 gives q as a signed byte (offset 0)
            wb = builder.xor(wb, ir.Constant(v64i8, [-128] * 64))
        wv = builder.bitcast(wb, v16)
        for u, xoff in enumerate(xoffs):
            xs = builder.load(builder.gep(xbase, [builder.add(xoff, ir.Constant(i64, q))]))
            xv = builder.insert_element(ir.Constant(v16, None), xs, ir.Constant(i32, 0))
            xv = builder.shuffle_vector(xv, ir.Constant(v16, None), ir.Constant(v16, [0] * 16))
            chain = q // 4 if split else q % chains
            a = accs[u][chain]
            if vnni:
                a = builder.call(fn, [a, wv, xv])
            elif sdot:
                a = _sdot16(builder, fn, a, wb, xv)
            elif avx2 and bits == 8:
                top = builder.and_(wb, ir.Constant(v64i8, [-128] * 64))
                low = builder.and_(wb, ir.Constant(v64i8, [127] * 64))
                a = builder.add(a, builder.add(_maddubs_ir(builder, low, xv), _maddubs_ir(builder, top, xv)))
            elif avx2:
                a = builder.add(a, _maddubs_ir(builder, wb, xv))
            else:
                # vpdpbusd's semantics in plain IR: zext(u8) * sext(s8), sums of 4 adjacent products
                w32 = builder.zext(builder.bitcast(wv, v64i8), v64i32)
                x32 = builder.sext(builder.bitcast(xv, v64i8), v64i32)
                p = builder.mul(w32, x32)
                for k in range(4):
                    a = builder.add(a, builder.shuffle_vector(p, p, ir.Constant(v16, [4 * j + k for j in range(16)])))
            accs[u][chain] = a
    if split:
        return [a for chain in accs for a in chain]
    out = []
    for chain in accs:
        a = chain[0]
        for b in chain[1:]:
            a = builder.add(a, b)
        out.append(a)
    return out


def _dot_codegen(n_tokens, bits, split=False):
    def codegen(context, builder, signature, args):
        acc_a = context.make_array(signature.args[0])(context, builder, value=args[0])
        w_a = context.make_array(signature.args[1])(context, builder, value=args[1])
        x_a = context.make_array(signature.args[3])(context, builder, value=args[3])
        v16 = ir.VectorType(ir.IntType(32), 16)
        xoffs = [context.cast(builder, args[4 + u], signature.args[4 + u], types.int64) for u in range(n_tokens)]
        woff = context.cast(builder, args[2], signature.args[2], types.int64)
        sums = _dot_block_ir(builder, builder.gep(w_a.data, [woff]), x_a.data, xoffs, HAS_VNNI, bits, split, HAS_SDOT,
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
# w: uint8; x4: int32 (flat arrays). One pair per weight format.
dot_block = _dot1(8, "8-bit format, one token")
dot_block4 = _dot4(8, "8-bit format, four tokens")
dot_block_q4 = _dot1(4, "4-bit format, one token")
dot_block4_q4 = _dot4(4, "4-bit format, four tokens")
dot_block_q5 = _dot1(5, "5-bit format, one token")
dot_block4_q5 = _dot4(5, "5-bit format, four tokens")
# 6-bit format, split in halves: iacc[32u:32u+16] columns 0-15, iacc[32u+16:32u+32] 16-31 of token u
dot_block_q6 = _dot1(6, "6-bit format, one token, two half-block sums", split=True)
dot_block4_q6 = _dot4(6, "6-bit format, four tokens, two half-block sums each", split=True)


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
    else:
        dot_block4_q6(iacc, w, wo, x4, xa, xb, xc, xd)


@kernel(inline=True)
def dot_tile(n, bits, iacc, w, wo, x4, x0, k4):
    """The block's dot products for n tokens (n = 4: the tokens at x0, x0 + k4, ..., one weight
    load each; otherwise the one at x0), in the format of `bits` (8, 4, 5, or 6 split)."""
    if n == 4:
        dot_tile4(bits, iacc, w, wo, x4, x0, x0 + k4, x0 + 2 * k4, x0 + 3 * k4)
    elif bits == 8:
        dot_block(iacc, w, wo, x4, x0)
    elif bits == 4:
        dot_block_q4(iacc, w, wo, x4, x0)
    elif bits == 5:
        dot_block_q5(iacc, w, wo, x4, x0)
    else:
        dot_block_q6(iacc, w, wo, x4, x0)


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
def _f16x16_to_f32(typingctx, dst, src, off):
    """dst[0:16] = the f16 values whose bits are src.flat[off:off + 16] (one vcvtph2ps); dst:
    float32, src: uint16."""
    if not _arrays(dst, src) or dst.dtype != types.float32 or src.dtype != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, value=args[0])
        s = context.make_array(signature.args[1])(context, builder, value=args[1])
        o = context.cast(builder, args[2], signature.args[2], types.int64)
        vh, vf = ir.VectorType(ir.HalfType(), 16), ir.VectorType(ir.FloatType(), 16)
        h = builder.load(builder.bitcast(builder.gep(s.data, [o]), vh.as_pointer()), align=2)
        builder.store(builder.fpext(h, vf), builder.bitcast(d.data, vf.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(dst, src, off), codegen


@kernel(inline=True)
def _scales_vector(flat, so, tmp):
    _f16x16_to_f32(tmp, flat, so)


@kernel(inline=True)
def _scales_scalar(flat, so, tmp):
    for ln in range(GROUP):
        tmp[ln] = f16_to_f32(flat[so + ln])


# block_scales(flat, so, tmp): tmp[0:16] = a block's 16 f16 scales (bits at flat[so:]) as float32,
# once per block for all its tokens: one vector conversion on F16C targets (elsewhere LLVM would
# call compiler-rt's __extendhfsf2, which numba's JIT cannot resolve)
block_scales = _scales_vector if HAS_F16C else _scales_scalar
