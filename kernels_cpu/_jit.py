"""Numba set-up shared by every CPU kernel: code-generation settings, the kernel decorators and
bit-level float16/bfloat16 helpers (numba on the CPU has no float16 type).

Code-generation settings (512-bit vectors on AVX-512, SLP vectorization) are
edge_infer/numba_codegen.py's, applied before any numba function is defined; here:
- `noalias` array arguments (a custom pipeline): kernels never get overlapping inputs and
  outputs, and telling LLVM so is what lets it vectorize loads and stores across arrays.

Float kernels never use fastmath=True: its `contract` and `nsz` let LLVM round differently
when it re-optimizes a function inside its caller, and a process that compiled a kernel runs
its own copy of the called functions while one that loaded it from numba's cache runs the
caller's copy (logits differed by up to 2 between a first and a second run). They take
REORDER (reductions may vectorize; tests/kernels_cpu/test_cache_determinism.py holds a cold
compile and a cache load to the same bits) and spell fused multiply-adds with fmadd.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import config, types
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.extending import intrinsic

from edge_infer import numba_codegen  # noqa: F401  (its settings before this package's first numba function)

# fastmath flags for kernels whose results must not depend on where LLVM inlined them: reorder
# sums (so reductions vectorize) but no `contract` (use fmadd) and no `nsz`, with which LLVM
# rewrites differently when it re-optimizes a function inside its caller (a kernel's parallel
# body runs its own compiled copy in the process that compiled it, the caller's copy when
# loaded from numba's cache).
REORDER = frozenset({"reassoc", "nnan", "ninf", "arcp", "afn"})


class NoAliasCompiler(CompilerBase):
    """numba's nopython pipeline with every array argument marked `noalias` for LLVM."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return [DefaultPassBuilder.define_nopython_pipeline(self.state)]


def kernel(fn=None, *, fastmath: bool | frozenset[str] = False, parallel: bool = False, inline: bool = False,
           refcount: bool = True):
    """`@njit(cache=True, nogil=True, error_model="numpy")` with noalias arguments; inputs and
    outputs must not overlap. inline=True inlines the function into its callers at numba's level
    (small helpers called in hot loops; not for fastmath functions: inlined code takes the
    caller's flags). refcount=False compiles without numba's reference counting (NRT), for a
    loop nest that allocates nothing: the counting it leaves around calls in branches costs
    atomic operations per call (kernels_cpu.matmul_k: ~65-100 ns per super-block)."""

    def wrap(f):
        # error_model="numpy": a float division by zero gives inf/nan instead of raising, so
        # loops with divisions have no early-exit branch and can vectorize.
        flags = fastmath if isinstance(fastmath, bool) else set(fastmath)  # numba takes no frozenset
        return numba.njit(cache=True, nogil=True, fastmath=flags, parallel=parallel, error_model="numpy",
                          inline="always" if inline else "never", pipeline_class=NoAliasCompiler,
                          **({} if refcount else {"_nrt": False}))(f)

    return wrap(fn) if fn is not None else wrap


@intrinsic
def _hw_f16_to_f32(typingctx, bits):
    """float32 value of IEEE half bits (a uint16); one vcvtph2ps on F16C/AVX-512 machines."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if bits.bitwidth > 16:
            v = builder.trunc(v, ir.IntType(16))
        elif bits.bitwidth < 16:
            v = builder.zext(v, ir.IntType(16))
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _hw_f32_to_f16(typingctx, value):
    """IEEE half bits (uint16) of a float32, rounded to nearest even (what numpy's astype does)."""
    if not isinstance(value, types.Float):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if value.bitwidth == 64:
            v = builder.fptrunc(v, ir.FloatType())
        return builder.bitcast(builder.fptrunc(v, ir.HalfType()), ir.IntType(16))

    return types.uint16(value), codegen


@intrinsic
def bf16_to_f32(typingctx, bits):
    """float32 value of bfloat16 bits (the top half of a float32)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = builder.zext(builder.trunc(args[0], ir.IntType(16)) if bits.bitwidth > 16 else args[0], ir.IntType(32))
        return builder.bitcast(builder.shl(v, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def fmadd(typingctx, a, b, c):
    """a * b + c for float32 (llvm.fmuladd): one fused multiply-add wherever the target has
    FMA, a multiply and an add elsewhere, decided by the target alone. Kernels use it instead
    of fastmath's `contract`, which lets LLVM fuse or not depending on what it inlined: code
    compiled in this process and the same code loaded from numba's cache (re-optimized inside
    its caller) then round differently. Marked reassociable, so a loop of them vectorizes as a
    reduction."""
    if not all(isinstance(t, types.Float) and t.bitwidth == 32 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fmuladd", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args, fastmath=("reassoc",))

    return types.float32(a, b, c), codegen


@intrinsic
def bits_to_f32(typingctx, bits):
    """Reinterpret the 32 bits of an integer as a float32 (no conversion)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if bits.bitwidth != 32:
            v = builder.trunc(v, ir.IntType(32)) if bits.bitwidth > 32 else builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def bit_at(typingctx, word, k):
    """(word >> k) & 1 as an int32, computed in 32-bit lanes (numba would widen to 64 bits,
    and LLVM then vectorizes per-lane variable shifts at half the width)."""
    if not isinstance(word, types.Integer) or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)

        def as32(v, t):
            return builder.trunc(v, i32) if t.bitwidth > 32 else (builder.zext(v, i32) if t.bitwidth < 32 else v)

        w, s = as32(args[0], word), as32(args[1], k)
        return builder.and_(builder.lshr(w, s), ir.Constant(i32, 1))

    return types.int32(word, k), codegen


@intrinsic
def f32_to_bits(typingctx, value):
    """The 32 bits of a float32 as an int32 (no conversion)."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(value), codegen


@intrinsic
def prefetch(typingctx, arr, index):
    """Hint the CPU to bring the cache line of arr.flat[index] (a C-contiguous array; index may
    run past the end: a prefetch never faults) into cache for reading. Streaming kernels issue
    it a few KB ahead, where the hardware prefetcher alone leaves them waiting on memory."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, value=args[0])
        i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(a.data, [idx]), i8p)
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, index), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _soft_f16_to_f32(h):
    # Integer-only conversion for targets without F16C: there LLVM would call compiler-rt's
    # __extendhfsf2, which numba's JIT cannot resolve.
    h = np.int32(h) & 0xFFFF
    sign = np.int32((h & 0x8000) << 16)
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0:  # zero or subnormal: mant * 2^-24 is exact in float32
        v = np.float32(mant) * np.float32(5.9604644775390625e-08)
        return -v if sign else v
    if exp == 31:
        return bits_to_f32(np.int32(sign | 0x7F800000 | (mant << 13)))
    return bits_to_f32(np.int32(sign | ((exp + 112) << 23) | (mant << 13)))


@numba.njit(cache=True, nogil=True, inline="always")
def _soft_f32_to_f16(x):
    # Round to nearest even, with numpy's handling of overflow (inf), NaN and subnormals.
    bits = f32_to_bits(np.float32(x))
    sign = (bits >> 16) & 0x8000
    e8 = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    if e8 == 0xFF:
        return np.uint16(sign | 0x7C00 | (0x200 if m != 0 else 0))
    e = e8 - 127 + 15
    if e >= 31:
        return np.uint16(sign | 0x7C00)
    if e <= 0:
        if e < -10:
            return np.uint16(sign)
        m = m | 0x800000
        shift = 14 - e
        r = m >> shift
        rem = m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (r & 1)):
            r += 1
        return np.uint16(sign | r)
    r = (e << 10) | (m >> 13)
    rem = m & 0x1FFF
    if rem > 0x1000 or (rem == 0x1000 and (r & 1)):
        r += 1  # a carry into the exponent is the right result (up to inf)
    return np.uint16(sign | r)


def target_has(feature: str) -> bool:
    """Whether numba compiles for a CPU with `feature` (e.g. "+f16c"): the configured target
    (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES) if any, else this host."""
    if (config.CPU_NAME or "").lower() == "generic" and not config.CPU_FEATURES:  # type: ignore[attr-defined]
        return False
    if config.CPU_FEATURES is not None:  # type: ignore[attr-defined]
        return feature in config.CPU_FEATURES.split(",")  # type: ignore[attr-defined]
    from numba.core.codegen import get_host_cpu_features

    return feature in get_host_cpu_features().split(",")


def _target_has_f16c() -> bool:
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True  # other targets (aarch64) convert halves natively
    return target_has("+f16c")


HAS_F16C = _target_has_f16c()
f16_to_f32 = _hw_f16_to_f32 if HAS_F16C else _soft_f16_to_f32
f32_to_f16 = _hw_f32_to_f16 if HAS_F16C else _soft_f32_to_f16



# Little-endian fields of a row of GGUF bytes w (uint8 [R, row_bytes]), row r, byte o: the
# decoders' and repacks' one reader.
@kernel(inline=True)
def u16_at(w, r, o):
    """The uint16 at bytes o, o + 1 of row r (an f16 scale's bits, as stored)."""
    return np.uint16(w[r, o]) | (np.uint16(w[r, o + 1]) << np.uint16(8))


@kernel(inline=True)
def u32_at(w, r, o):
    """The uint32 at bytes o..o + 3 of row r."""
    return np.uint32(u16_at(w, r, o)) | (np.uint32(u16_at(w, r, o + 2)) << np.uint32(16))


@kernel(inline=True)
def half_at(w, r, o):
    """The f16 at bytes o, o + 1 of row r, as float32."""
    return f16_to_f32(u16_at(w, r, o))
