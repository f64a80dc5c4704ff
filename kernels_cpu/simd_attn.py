"""Attention scores with the keys in vector lanes, as LLVM IR (kernels_cpu.attention_tiles):
16 keys' float32 values per head dimension d (kt[16 d : 16 d + 16], the K pool's transposed
blocks converted) meet one query row's q[d], broadcast, in one fused multiply-add per d. Each
lane's sum is the sequential chain over d = 0..hd-1 of fmuladd (fused wherever the target has
FMA, as kernels_cpu._jit.fmadd), so a score is the same bits whichever rows or keys share the
call: no horizontal sum, no reassociation. Up to eight query rows share each kt load (eight
independent chains keep both FMA ports busy; four leave them waiting on the FMA latency).

A block-type K pool's decoded rows become that layout through transpose16 (16 x 16 floats in
registers, four rounds of lane swaps).

The weighted value sums (pv_lanes) hold a tile of up to 4 rows x 4 16-lane slices of the head
dimension in registers across a run of keys, each lane the sequential fmuladd chain in key
order: the accumulators go through memory once per run instead of once per key.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF = ir.VectorType(_F32, 16)


def _vptr(builder, base, off):
    """A <16 x float>* at base[off]."""
    return builder.bitcast(builder.gep(base, [off]), _VF.as_pointer())


def _lanes(builder, base, off, elem):
    """base[off:off + 16] as <16 x float>: float32 loaded, or IEEE half bits (uint16) loaded and
    widened (fpext: exact, the bits widen16 stores)."""
    if elem == types.uint16:
        vh = ir.VectorType(ir.HalfType(), 16)
        return builder.fpext(builder.load(builder.bitcast(builder.gep(base, [off]), vh.as_pointer()), align=2), _VF)
    return builder.load(_vptr(builder, base, off), align=4)


def _arg_readers(context, builder, signature, args):
    """An intrinsic's argument k as its data pointer (an array: data(k)) or as an i64 (i64(k))."""
    def data(k):
        return context.make_array(signature.args[k])(context, builder, value=args[k]).data

    def i64(k):
        return context.cast(builder, args[k], signature.args[k], types.int64)
    return data, i64


_LANE_TYPES = (types.float32, types.uint16)  # what qk_lanes' keys and pv_lanes' values may be


def _broadcast(builder, base, off):
    """base[off] (float32) in all 16 lanes."""
    x = builder.insert_element(ir.Constant(_VF, None), builder.load(builder.gep(base, [off])), ir.Constant(_I32, 0))
    return builder.shuffle_vector(x, ir.Constant(_VF, None), ir.Constant(ir.VectorType(_I32, 16), [0] * 16))


@intrinsic
def qk_lanes(typingctx, sc, so, sstride, q, qo, qstride, kt, k0, k1, kds, hd, vs, nrows, nch):
    """For r < nrows (a literal, 1..8), chunks h < nch (a literal, 1 or 2) of 16 keys:
    sc[so + r * sstride + 16 h + l] = (chain over d < hd of q[qo + r * qstride + d] *
    kt[k_h + kds d + l]) * vs[16 h + l], the 16 lanes l, k_h = k0 or k1: chunk h's first key
    of dimension 0, kds: the step between dimensions (16 in a converted chunk; the block size
    read straight from a K pool block). sc, q, vs: float32 (flat, C-contiguous); kt: float32,
    or half bits (uint16), widened in the register."""
    if not isinstance(nrows, types.IntegerLiteral) or not 1 <= nrows.literal_value <= 8:
        return None
    if not isinstance(nch, types.IntegerLiteral) or not 1 <= nch.literal_value <= 2:
        return None
    if not all(isinstance(a, types.Array) for a in (sc, q, kt, vs)) or kt.dtype not in _LANE_TYPES:
        return None
    n, m = nrows.literal_value, nch.literal_value
    sig = types.void(sc, so, sstride, q, qo, qstride, kt, k0, k1, kds, hd, vs, nrows, nch)

    def codegen(context, builder, signature, args):
        data, i64 = _arg_readers(context, builder, signature, args)
        scp, qp, ktp, vsp = data(0), data(3), data(6), data(11)
        so64, ss64, qo64, qs64, hd64 = i64(1), i64(2), i64(4), i64(5), i64(10)
        kbase, kds64 = [i64(7), i64(8)], i64(9)
        fma = builder.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF, _VF]))
        slots = [[cgutils.alloca_once(builder, _VF) for _ in range(m)] for _ in range(n)]  # registers after mem2reg
        for row in slots:
            for s in row:
                builder.store(ir.Constant(_VF, None), s)  # zeros
        qrow = [builder.add(qo64, builder.mul(ir.Constant(_I64, r), qs64)) for r in range(n)]
        with cgutils.for_range(builder, hd64) as loop:
            d = loop.index
            at = builder.mul(d, kds64)
            kv = [_lanes(builder, ktp, builder.add(at, kbase[h]), kt.dtype) for h in range(m)]
            for r in range(n):
                xv = _broadcast(builder, qp, builder.add(qrow[r], d))
                for h in range(m):
                    builder.store(builder.call(fma, [xv, kv[h], builder.load(slots[r][h])]), slots[r][h])
        for h in range(m):
            scale = builder.load(_vptr(builder, vsp, ir.Constant(_I64, 16 * h)), align=4)
            for r in range(n):
                at = builder.add(builder.add(so64, builder.mul(ir.Constant(_I64, r), ss64)), ir.Constant(_I64, 16 * h))
                builder.store(builder.fmul(builder.load(slots[r][h]), scale), _vptr(builder, scp, at), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def pv_lanes(typingctx, acc, ao, astride, w, wo, wstride, vt, vo, vstride, nkeys, nrows, nsl):
    """For r < nrows, s < nsl (literals 1..4), each lane l < 16 of slice s:
    acc[ao + r * astride + 16 s + l] = fmuladd(w[wo + r * wstride + j], vt[vo + j * vstride +
    16 s + l], acc[...]) for j = 0..nkeys-1 in that order. acc, w: float32 (flat); vt: float32,
    or half bits (uint16: a V pool read in place), widened in the register."""
    lits = (nrows, nsl)
    if not all(isinstance(x, types.IntegerLiteral) and 1 <= x.literal_value <= 4 for x in lits):
        return None
    if not all(isinstance(a, types.Array) for a in (acc, w, vt)) or vt.dtype not in _LANE_TYPES:
        return None
    n, m = nrows.literal_value, nsl.literal_value
    sig = types.void(acc, ao, astride, w, wo, wstride, vt, vo, vstride, nkeys, nrows, nsl)

    def codegen(context, builder, signature, args):
        data, i64 = _arg_readers(context, builder, signature, args)
        accp, wp, vtp = data(0), data(3), data(6)
        ao64, as64, wo64, ws64, vo64, vs64, nk64 = (i64(k) for k in (1, 2, 4, 5, 7, 8, 9))
        fma = builder.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF, _VF]))

        at = [[builder.add(builder.add(ao64, builder.mul(ir.Constant(_I64, r), as64)), ir.Constant(_I64, 16 * k))
               for k in range(m)] for r in range(n)]
        slots = [[cgutils.alloca_once(builder, _VF) for _ in range(m)] for _ in range(n)]  # registers after mem2reg
        for r in range(n):
            for k in range(m):
                builder.store(builder.load(_vptr(builder, accp, at[r][k]), align=4), slots[r][k])
        wrow = [builder.add(wo64, builder.mul(ir.Constant(_I64, r), ws64)) for r in range(n)]
        with cgutils.for_range(builder, nk64) as loop:
            j = loop.index
            vrow = builder.add(vo64, builder.mul(j, vs64))
            vv = [_lanes(builder, vtp, builder.add(vrow, ir.Constant(_I64, 16 * k)), vt.dtype) for k in range(m)]
            for r in range(n):
                xv = _broadcast(builder, wp, builder.add(wrow[r], j))
                for k in range(m):
                    builder.store(builder.call(fma, [xv, vv[k], builder.load(slots[r][k])]), slots[r][k])
        for r in range(n):
            for k in range(m):
                builder.store(builder.load(slots[r][k]), _vptr(builder, accp, at[r][k]), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def row_max(typingctx, src, so, n):
    """The largest of src[so:so + n] (n >= 1; float32, flat): 16 lanes of maxnum, then their
    reduction. max is exact and order-free, so this is the sequential loop's value."""
    if not isinstance(src, types.Array) or src.dtype != types.float32:
        return None
    sig = types.float32(src, so, n)

    def codegen(context, builder, signature, args):
        sp = context.make_array(signature.args[0])(context, builder, value=args[0]).data
        so64, n64 = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (1, 2))
        vmax = builder.module.declare_intrinsic("llvm.maxnum.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF]))
        red = builder.module.declare_intrinsic("llvm.vector.reduce.fmax.v16f32", fnty=ir.FunctionType(_F32, [_VF]))
        splat = _broadcast(builder, sp, so64)  # src[so] in every lane: neutral for the maximum
        lanes = cgutils.alloca_once(builder, _VF)
        builder.store(splat, lanes)
        whole = builder.udiv(n64, ir.Constant(_I64, 16))
        with cgutils.for_range(builder, whole) as loop:
            v = builder.load(_vptr(builder, sp, builder.add(so64, builder.mul(loop.index, ir.Constant(_I64, 16)))), align=4)
            builder.store(builder.call(vmax, [builder.load(lanes), v]), lanes)
        # the last n % 16 as one masked load (the other lanes: src[so], already counted), not a
        # scalar loop: LLVM's vectorizer asserts on a maxnum reduction loop
        tail = builder.mul(whole, ir.Constant(_I64, 16))
        vi = ir.VectorType(_I32, 16)
        rem = builder.insert_element(ir.Constant(vi, None), builder.trunc(builder.sub(n64, tail), _I32), ir.Constant(_I32, 0))
        rem = builder.shuffle_vector(rem, ir.Constant(vi, None), ir.Constant(vi, [0] * 16))
        mask = builder.icmp_unsigned("<", ir.Constant(vi, list(range(16))), rem)
        mload = builder.module.declare_intrinsic(
            "llvm.masked.load.v16f32.p0", fnty=ir.FunctionType(_VF, [_VF.as_pointer(), _I32, ir.VectorType(ir.IntType(1), 16), _VF]))
        last = builder.call(mload, [_vptr(builder, sp, builder.add(so64, tail)), ir.Constant(_I32, 4), mask, splat])
        return builder.call(red, [builder.call(vmax, [builder.load(lanes), last])])

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


@intrinsic
def transpose16(typingctx, dst, src, sstride, count):
    """dst[256 i + 16 d + u] = src[u * sstride + 16 i + d] for i < count and d, u < 16: 16 rows
    (keys) of 16-float slices made 16 vectors of one dimension's 16 keys, in registers (the
    off-diagonal 8, 4, 2 and 1 blocks swapped in turn). dst, src: float32 (flat)."""
    if not isinstance(dst, types.Array) or not isinstance(src, types.Array):
        return None
    sig = types.void(dst, src, sstride, count)

    def codegen(context, builder, signature, args):
        dp = context.make_array(signature.args[0])(context, builder, value=args[0]).data
        sp = context.make_array(signature.args[1])(context, builder, value=args[1]).data
        ss64, n64 = (context.cast(builder, args[k], signature.args[k], types.int64) for k in (2, 3))
        vi = ir.VectorType(_I32, 16)
        with cgutils.for_range(builder, n64) as loop:
            col = builder.mul(loop.index, ir.Constant(_I64, 16))
            v = [builder.load(_vptr(builder, sp, builder.add(builder.mul(ir.Constant(_I64, u), ss64), col)), align=4)
                 for u in range(16)]
            for k in (8, 4, 2, 1):  # swap the off-diagonal k x k blocks of every 2k x 2k block
                lo = ir.Constant(vi, [j if j & k == 0 else 16 + j - k for j in range(16)])
                hi = ir.Constant(vi, [j + k if j & k == 0 else 16 + j for j in range(16)])
                for i in range(16):
                    if i & k == 0:
                        a, b = v[i], v[i + k]
                        v[i], v[i + k] = builder.shuffle_vector(a, b, lo), builder.shuffle_vector(a, b, hi)
            base = builder.mul(loop.index, ir.Constant(_I64, 256))
            for d in range(16):
                builder.store(v[d], _vptr(builder, dp, builder.add(base, ir.Constant(_I64, 16 * d))), align=4)
        return context.get_dummy_value()

    return sig, codegen
