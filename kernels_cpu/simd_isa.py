"""The target's vector instruction sets and their IR idioms: which int8 dot product this CPU
takes (AVX-512 VNNI `vpdpbusd`; aarch64's `sdot` where the CPU has the dot-product extension;
AVX2's `vpmaddubsw` + `vpmaddwd`; otherwise plain vector IR), how the 5- and 6-bit formats
store their high code bits for it, how far ahead the kernels prefetch, and the IR of the sdot
and AVX2 dot products (kernels_cpu.simd_dot builds the blocks' sums from them)."""

from __future__ import annotations

import platform

from llvmlite import ir
from numba.core import config

from ._jit import target_has

# Software prefetch distance (measured on the 2-core AVX-512 VM: a streamed GEMV ran at 9 of
# the core's 14 GB/s with the hardware prefetcher alone, 12-13 with these).
PREFETCH_BYTES = 2048  # ahead of the quad being read, in the interleaved weights
HAS_VNNI = target_has("+avx512vnni") and target_has("+avx512bw")
# The K-quant tile's: its super-blocks' headers and the scale unpacking between them leave gaps
# in the stream, which a longer lead covers (2-core AVX2 Zen 3, one thread, Q4_K GEMV from
# memory: 12.5 -> 14.9 GB/s, five runs each; the int8 kernel's types gained nothing from it).
PREFETCH_K_BYTES = 4096
# A GEMV's (the tile's inline-scale modes; None: no software prefetch). On the 2-core AVX-512
# Zen 4 VM, once a GEMV made its scales in its loop (simd_tile.MODE_MIN_INLINE), these
# prefetches held it back (2 threads, 400 MB of 8,960 x 1,536 matrices cycled, the int8
# kernel's Q4_0, which keeps its own, beside it as the control; two runs each): Q4_K 0.71-0.77x
# Q4_0's GB/s with them, 1.04-1.09x without; Q5_K 0.94-0.97x -> 1.06-1.13x. The GEMM keeps
# PREFETCH_K_BYTES: only its first tile per row group reads from memory.
PREFETCH_K_GEMV_BYTES: int | None = None if HAS_VNNI else PREFETCH_K_BYTES
# AVX2 without VNNI: vpmaddubsw (u8 x s8 pairs to saturating i16) then vpmaddwd by ones (i16
# pairs to i32), llama.cpp's idiom; LLVM lowers the plain-IR form to widening multiplies and
# lane shuffles, ~8x slower on a 2-core AVX2 VM.
HAS_AVX2_DOT = not HAS_VNNI and platform.machine().lower() in ("x86_64", "amd64") and target_has("+avx2")
# How the 5- and 6-bit formats store their high code bits (the same bytes either way). With
# AVX-512's mask registers, a 64-bit mask per quad (bit 4l + k: byte 4l + k) is one kmov and a
# masked op. Without them (AVX2, aarch64, plain IR) a mask is spread into bytes by a broadcast,
# a shuffle and a compare per 32 bytes, and Q6_K's two masks made its GEMV 2.4x slower per
# weight than Q4_K's (2-core AVX2 Zen 3: 11.4 against 26.9 GMAC/s): there the bits are byte
# fields instead, which a shift and an AND put in place (high_field_ir).
HIGH_BITS_AS_MASKS = HAS_VNNI
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
# The 8-bit formats' bytes (Q8_0's q + 128; the table and grid formats' values v + 128) reach
# the dot product as the signed q (v) where it takes signed weights: sdot, and AVX2's
# vpsignb idiom (signed_dot_ir: 4 operations a 32-byte half, where splitting the unsigned
# bytes into their top bit and low 7 bits took 7). Their sums then need no offset correction.
SIGNED_EIGHT = HAS_SDOT or HAS_AVX2_DOT


def high_field_ir(builder, h, q, bits):
    """<64 x i8>: quad q's high code bits in place (bit 4; bits 4 and 5 for bits 6) from the
    field bytes h <64 x i8> (HIGH_BITS_AS_MASKS off): the 5-bit format's bit q of byte 4l + k
    (the 64 bytes at 256), the 6-bit format's bits 2 (q % 4), 2 (q % 4) + 1 of byte 4l + k of
    the 64 bytes at 256 + 64 (q // 4)."""
    v64i8 = ir.VectorType(ir.IntType(8), 64)
    shift = 4 - (q if bits == 5 else 2 * (q % 4))
    if shift > 0:
        h = builder.shl(h, ir.Constant(v64i8, [shift] * 64))
    elif shift < 0:
        h = builder.lshr(h, ir.Constant(v64i8, [-shift] * 64))
    return builder.and_(h, ir.Constant(v64i8, [16 if bits == 5 else 48] * 64))


def sdot16_ir(builder, fn, a, wb, xv):
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


def maddubs16_ir(builder, wb, xv):
    """<32 x i16>: vpmaddubsw's pair sums (zext(u8) * sext(s8) of 2 adjacent bytes, saturated to
    i16) of wb <64 x i8> with xv's bytes, one per 32-byte half (AVX2)."""
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    v32i8, v16i16, v64i8 = ir.VectorType(i8, 32), ir.VectorType(i16, 16), ir.VectorType(i8, 64)
    maddubs = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    xb = builder.bitcast(xv, v64i8)

    def half(v, h):
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 32), list(range(32 * h, 32 * h + 32))))

    parts = [builder.call(maddubs, [half(wb, h), half(xb, h)]) for h in (0, 1)]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(i32, 32), list(range(32))))


def widen16_ir(builder, p):
    """<16 x i32>: the sums of adjacent i16 pairs of p <32 x i16> (vpmaddwd by ones per half)."""
    i16, i32 = ir.IntType(16), ir.IntType(32)
    v16i16, v8i32 = ir.VectorType(i16, 16), ir.VectorType(i32, 8)
    maddwd = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    ones = ir.Constant(v16i16, [1] * 16)
    parts = [builder.call(maddwd, [builder.shuffle_vector(p, p, ir.Constant(ir.VectorType(i32, 16),
                                                                            list(range(16 * h, 16 * h + 16)))), ones])
             for h in (0, 1)]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(i32, 16), list(range(16))))


def maddubs_ir(builder, wb, xv):
    """vpdpbusd's <16 x i32> lane sums (zext(u8) * sext(s8) of 4 adjacent bytes) with AVX2:
    vpmaddubsw then vpmaddwd by ones on each 32-byte half. vpmaddubsw saturates a pair's i16
    sum, which codes below 64 (the 4-, 5- and 6-bit formats) never reach with |x| <= 128;
    8-bit codes are split into their low 7 bits and their top bit (0 or 128), each pair
    sum then within +-32768, so every lane is the exact integer."""
    return widen16_ir(builder, maddubs16_ir(builder, wb, xv))


def signed_dot_ir(builder, wb, xv):
    """<16 x i32> lane sums of signed weight bytes wb <64 x i8> times xv's signed bytes (4
    adjacent products a lane) with AVX2, llama.cpp's idiom: vpmaddubsw of |w| (vpabsb; -128
    gives the u8 128) with x * sign(w) (vpsignb), then vpmaddwd by ones. Exact: the
    activations stay within +-127 (kernels_cpu.matmul_i8.quantize_rows_q8), so vpsignb never
    negates -128 and a pair sum is at most 2 * 128 * 127 = 32,512."""
    i8, i32 = ir.IntType(8), ir.IntType(32)
    v32i8, v64i8 = ir.VectorType(i8, 32), ir.VectorType(i8, 64)
    psign = builder.module.declare_intrinsic("llvm.x86.avx2.psign.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    xb = builder.bitcast(xv, v64i8)
    zero = ir.Constant(v64i8, None)
    wabs = builder.select(builder.icmp_signed("<", wb, zero), builder.sub(zero, wb), wb)

    def half(v, h):
        return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 32), list(range(32 * h, 32 * h + 32))))

    xs = [builder.call(psign, [half(xb, h), half(wb, h)]) for h in (0, 1)]
    xsigned = builder.shuffle_vector(xs[0], xs[1], ir.Constant(ir.VectorType(i32, 64), list(range(64))))
    return maddubs_ir(builder, wabs, builder.bitcast(xsigned, xv.type))


# AVX2: how many quads' vpmaddubsw pair sums of a format add up in i16 before one vpmaddwd
# widens them, exactly: a pair sum is at most 2 * code_max * 128 in magnitude (4-bit: 3,840,
# eight of them 30,720 < 32,768; 5-bit: 7,936, four; 6-bit: 16,128, two; the ternary codes
# 0..2: eight). The 8-bit formats' (signed_dot_ir) take a whole i16 each: one.
I16_QUADS = {4: 8, 2: 8, 5: 4, 6: 2}
