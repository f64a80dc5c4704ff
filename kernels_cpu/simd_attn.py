"""Attention scores with the keys in vector lanes, as LLVM IR (kernels_cpu.attention_tiles):
16 keys' float32 values per head dimension d (kt[16 d : 16 d + 16], the K pool's transposed
blocks converted) meet one query row's q[d], broadcast, in one fused multiply-add per d. Each
lane's sum is the sequential chain over d = 0..hd-1 of fmuladd (fused wherever the target has
FMA, as kernels_cpu._jit.fmadd), so a score is the same bits whichever rows or keys share the
call: no horizontal sum, no reassociation. Up to four query rows share each kt load.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF = ir.VectorType(_F32, 16)


@intrinsic
def qk_lanes(typingctx, sc, so, sstride, q, qo, qstride, kt, hd, vs, nrows):
    """For r < nrows (a literal, 1..4): sc[so + r * sstride + l] = (chain over d < hd of
    q[qo + r * qstride + d] * kt[16 d + l]) * vs[l], the 16 lanes l. sc, q, kt, vs: float32
    (flat, C-contiguous)."""
    if not isinstance(nrows, types.IntegerLiteral) or not 1 <= nrows.literal_value <= 4:
        return None
    if not all(isinstance(a, types.Array) for a in (sc, q, kt, vs)):
        return None
    n = nrows.literal_value
    sig = types.void(sc, so, sstride, q, qo, qstride, kt, hd, vs, nrows)

    def codegen(context, builder, signature, args):
        def data(k):
            return context.make_array(signature.args[k])(context, builder, value=args[k]).data

        def i64(k):
            return context.cast(builder, args[k], signature.args[k], types.int64)

        scp, qp, ktp, vsp = data(0), data(3), data(6), data(8)
        so64, ss64, qo64, qs64, hd64 = i64(1), i64(2), i64(4), i64(5), i64(7)
        fma = builder.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF, _VF]))
        slots = [cgutils.alloca_once(builder, _VF) for _ in range(n)]  # registers after mem2reg
        for s in slots:
            builder.store(ir.Constant(_VF, None), s)
        qrow = [builder.add(qo64, builder.mul(ir.Constant(_I64, r), qs64)) for r in range(n)]
        with cgutils.for_range(builder, hd64) as loop:
            d = loop.index
            kv = builder.load(builder.bitcast(builder.gep(ktp, [builder.mul(d, ir.Constant(_I64, 16))]),
                                              _VF.as_pointer()), align=4)
            for r in range(n):
                x = builder.load(builder.gep(qp, [builder.add(qrow[r], d)]))
                xv = builder.insert_element(ir.Constant(_VF, None), x, ir.Constant(_I32, 0))
                xv = builder.shuffle_vector(xv, ir.Constant(_VF, None), ir.Constant(ir.VectorType(_I32, 16), [0] * 16))
                builder.store(builder.call(fma, [xv, kv, builder.load(slots[r])]), slots[r])
        scale = builder.load(builder.bitcast(vsp, _VF.as_pointer()), align=4)
        for r in range(n):
            at = builder.gep(scp, [builder.add(so64, builder.mul(ir.Constant(_I64, r), ss64))])
            builder.store(builder.fmul(builder.load(slots[r]), scale), builder.bitcast(at, _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def widen16(typingctx, dst, do, src, so, count):
    """dst[do + 16 i + l] = float32 of src[so + 16 i + l] for i < count, the 16 lanes l: src
    uint16 (IEEE half bits: vcvtph2ps), int8 or float32; dst float32 (flat)."""
    if not isinstance(dst, types.Array) or not isinstance(src, types.Array):
        return None
    kind = src.dtype
    if kind not in (types.uint16, types.int8, types.float32):
        return None
    sig = types.void(dst, do, src, so, count)

    def codegen(context, builder, signature, args):
        dp = context.make_array(signature.args[0])(context, builder, value=args[0]).data
        sp = context.make_array(signature.args[2])(context, builder, value=args[2]).data
        do64, so64, n64 = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 3, 4))
        elem = {types.uint16: ir.HalfType(), types.int8: ir.IntType(8), types.float32: _F32}[kind]
        vt = ir.VectorType(elem, 16)
        with cgutils.for_range(builder, n64) as loop:
            at = builder.mul(loop.index, ir.Constant(_I64, 16))
            v = builder.load(builder.bitcast(builder.gep(sp, [builder.add(so64, at)]), vt.as_pointer()), align=1)
            if kind == types.uint16:
                v = builder.fpext(v, _VF)
            elif kind == types.int8:
                v = builder.sitofp(v, _VF)
            builder.store(v, builder.bitcast(builder.gep(dp, [builder.add(do64, at)]), _VF.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen
