"""Vector code of the K-quant int8 matmul (kernels_cpu.matmul_k) as LLVM IR, 16 row lanes at a
time: unpacking a super-block's sub-block scales (to int32, then float). (numba left the same
loops scalar.)

All arrays are flat and C-contiguous; offsets count elements. Integer work is exact in int32
(bounds in kernels_cpu.matmul_k), so how it is ordered changes no bit.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

_I8, _I32 = ir.IntType(8), ir.IntType(32)
_V16I8, _V16I32, _V16F = ir.VectorType(_I8, 16), ir.VectorType(_I32, 16), ir.VectorType(ir.FloatType(), 16)


def _arrays(*ts) -> bool:
    return all(isinstance(t, types.Array) for t in ts)


def _ptr(context, builder, signature, args, k, off_arg, vt):
    """The vector pointer of array args[k] at element args[off_arg]."""
    a = context.make_array(signature.args[k])(context, builder, value=args[k])
    off = context.cast(builder, args[off_arg], signature.args[off_arg], types.int64)
    return builder.bitcast(builder.gep(a.data, [off]), vt.as_pointer())


def _at(builder, ptr, j: int):
    """ptr (a vector pointer) advanced by j vectors."""
    return builder.gep(ptr, [ir.Constant(ir.IntType(64), j)])


def _const(v: int) -> ir.Constant:
    return ir.Constant(_V16I32, [v] * 16)


@intrinsic
def widen_scales(typingctx, sc, to, src, off, n):
    """Q6_K, IQ4_XS: the n (a literal int: 16, 8) int8 sub-block scales of 16 rows, byte-major
    (scale j of lane l at src[off + 16 j + l], uint8 holding the int8 bits) -> sc[to + 16 j + l]
    int32, sign-extended."""
    if not _arrays(sc, src) or not isinstance(n, types.IntegerLiteral):
        return None
    count = n.literal_value

    def codegen(context, builder, signature, args):
        base = _ptr(context, builder, signature, args, 2, 3, ir.IntType(8))
        sp = _ptr(context, builder, signature, args, 0, 1, _V16I32)
        for j in range(count):
            at = ir.Constant(ir.IntType(64), 16 * j)
            v = builder.load(builder.bitcast(builder.gep(base, [at]), _V16I8.as_pointer()), align=1)
            builder.store(builder.sext(v, _V16I32), _at(builder, sp, j), align=4)
        return context.get_dummy_value()

    return types.void(sc, to, src, off, n), codegen


@intrinsic
def widen_odd_nibbles(typingctx, sc, to, src, off, n):
    """The grid types: n (a literal int: 8, 16) 4-bit sub-block scales s of 16 rows, two per
    byte (byte j of lane l at src[off + 16 j + l]: s of sub-block 2j low, 2j + 1 high) ->
    sc[to + 16 i + l] = 2 s + 1, int32."""
    if not _arrays(sc, src) or not isinstance(n, types.IntegerLiteral):
        return None
    count = n.literal_value

    def codegen(context, builder, signature, args):
        base = _ptr(context, builder, signature, args, 2, 3, ir.IntType(8))
        sp = _ptr(context, builder, signature, args, 0, 1, _V16I32)
        for j in range(count // 2):
            v = builder.zext(builder.load(builder.bitcast(builder.gep(base, [ir.Constant(ir.IntType(64), 16 * j)]),
                                                          _V16I8.as_pointer()), align=1), _V16I32)
            for h, s in enumerate((builder.and_(v, _const(15)), builder.lshr(v, _const(4)))):
                builder.store(builder.add(builder.shl(s, _const(1)), _const(1)), _at(builder, sp, 2 * j + h), align=4)
        return context.get_dummy_value()

    return types.void(sc, to, src, off, n), codegen


@intrinsic
def scale_rows(typingctx, dst, src, at, n, d, do, negate):
    """dst[at + 16 j + l] = float32(src[at + 16 j + l]) * d[do + l] (negated when negate) for
    j < n (a literal int), the 16 lanes l: a super-block's sub-block scales as float. dst, d
    float32; src int32. With d an f16 value and src below 2^11 the product is exact."""
    if not _arrays(dst, src, d) or not isinstance(n, types.IntegerLiteral) or not isinstance(negate, types.BooleanLiteral):
        return None
    count, neg = n.literal_value, negate.literal_value

    def codegen(context, builder, signature, args):
        dp = _ptr(context, builder, signature, args, 0, 2, _V16F)
        sp = _ptr(context, builder, signature, args, 1, 2, _V16I32)
        dv = builder.load(_ptr(context, builder, signature, args, 4, 5, _V16F), align=4)
        if neg:
            dv = builder.fneg(dv)
        for j in range(count):
            v = builder.sitofp(builder.load(_at(builder, sp, j), align=4), _V16F)
            builder.store(builder.fmul(v, dv), _at(builder, dp, j), align=4)
        return context.get_dummy_value()

    return types.void(dst, src, at, n, d, do, negate), codegen
