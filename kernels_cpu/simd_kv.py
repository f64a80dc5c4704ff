"""The attention lanes (kernels_cpu.simd_attn) reading a Q8_0 or Q4_0 KV pool in place, as
LLVM IR: the codes are widened and scaled in the registers, each value the float32 that
kernels_cpu.dequant's row decoder stores (the code times the block's half scale, exact), so
every score and weighted sum is the same bits as through a decoded chunk.

Keys: a 32-dimension block's codes of 16 keys (rows kstride bytes apart) are loaded as
little-endian words, 8 per key (Q8_0: 4 codes each) or 4 (Q4_0: 4 low and 4 high nibbles),
and transposed in registers so that a word vector holds one word of each of the 16 keys
(lane l: key l); each code is then shifted out of its word into the 16 lanes.
Values: a value row's 16 dimensions are 16 consecutive codes (Q8_0) or 16 nibbles of one
block's 16 bytes (Q4_0: dimensions 0-15 the low, 16-31 the high), one vector load.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from edge_infer.formats.weight_types import Q4_0, Q8_0

from .simd_attn import _F32, _I32, _I64, _VF, _arg_readers, _broadcast, _vptr

_I8, _I16 = ir.IntType(8), ir.IntType(16)
_VI = ir.VectorType(_I32, 16)
IN_PLACE = {Q8_0: (34, 8), Q4_0: (18, 4)}  # GGML type id: (block bytes, code words per key and block)


def _at(builder, base, off, ty):
    """A ty* at byte offset off (i64) of the i8* base."""
    return builder.bitcast(builder.gep(base, [off]), ty.as_pointer())


def _c(v):
    return ir.Constant(_I64, v)


def _key_scales(builder, pool, rows, boff):
    """<16 x float>: the half scale at byte boff of the 16 key rows (byte offsets `rows`)."""
    vh = ir.Constant(ir.VectorType(_I16, 16), None)
    for lane in range(16):
        x = builder.load(_at(builder, pool, builder.add(rows[lane], boff), _I16), align=1)
        vh = builder.insert_element(vh, x, ir.Constant(_I32, lane))
    return builder.fpext(builder.bitcast(vh, ir.VectorType(ir.HalfType(), 16)), _VF)


def _key_words(builder, pool, rows, qoff, n):
    """n vectors <16 x i32>: vector i's lane l is word i of key l's codes at byte qoff (n = 8
    or 4 words a key): the keys' words placed n to a lane group, then each group transposed
    (simd_attn.transpose16's rounds below n)."""
    vn = ir.VectorType(_I32, n)
    keys = [builder.load(_at(builder, pool, builder.add(rows[u], qoff), vn), align=1) for u in range(16)]
    groups = 16 // n
    v = []
    for u in range(n):  # vector u: key u + n g in lane group g
        parts = [keys[u + n * g] for g in range(groups)]
        while len(parts) > 1:
            w = len(parts[0].type)
            parts = [builder.shuffle_vector(parts[k], parts[k + 1], ir.Constant(ir.VectorType(_I32, 2 * w), list(range(2 * w))))
                     for k in range(0, len(parts), 2)]
        v.append(parts[0])
    k = n // 2
    while k >= 1:  # the lane groups' off-diagonal k x k blocks swapped
        lo = ir.Constant(_VI, [j if j & k == 0 else 16 + j - k for j in range(16)])
        hi = ir.Constant(_VI, [j + k if j & k == 0 else 16 + j for j in range(16)])
        for i in range(n):
            if i & k == 0:
                a, b = v[i], v[i + k]
                v[i], v[i + k] = builder.shuffle_vector(a, b, lo), builder.shuffle_vector(a, b, hi)
        k //= 2
    return v


def _splat_i32(x):
    return ir.Constant(_VI, [x] * 16)


def _code_lanes(builder, word, qtype, j, high):
    """<16 x float> of byte j's code (Q8_0: the signed byte; Q4_0: its low or high nibble less 8)."""
    if qtype == Q8_0:
        x = builder.ashr(builder.shl(word, _splat_i32(24 - 8 * j)), _splat_i32(24))
    else:
        x = builder.and_(builder.lshr(word, _splat_i32(8 * j + (4 if high else 0))), _splat_i32(15))
        x = builder.sub(x, _splat_i32(8))
    return builder.sitofp(x, _VF)


def _block_dims(qtype):
    """(word, byte, high) of each of a block's 32 dimensions, in dimension order."""
    if qtype == Q8_0:
        return [(d // 4, d % 4, False) for d in range(32)]
    return [((d % 16) // 4, d % 4, d >= 16) for d in range(32)]


@intrinsic
def qk_lanes_q(typingctx, sc, so, sstride, q, qo, qstride, pool, k0, k1, kstride, hd, vs, nrows, nch, qtype):
    """simd_attn.qk_lanes for a Q8_0 / Q4_0 K pool read in place: chunk h's key l is the row at
    byte k_h + l kstride of pool (uint8, flat), k_h = k0 or k1; qtype: a literal GGML type id
    (Q8_0, Q4_0); nrows 1..8, nch 1 or 2 literals; hd a multiple of 32. The scores are
    qk_lanes' bits on the decoded keys."""
    lits = (nrows, nch, qtype)
    if not all(isinstance(x, types.IntegerLiteral) for x in lits):
        return None
    n, m, qt = nrows.literal_value, nch.literal_value, qtype.literal_value
    if not (1 <= n <= 8 and 1 <= m <= 2 and qt in IN_PLACE):
        return None
    if not all(isinstance(a, types.Array) for a in (sc, q, pool, vs)) or pool.dtype != types.uint8:
        return None
    bb, nw = IN_PLACE[qt]
    dims = _block_dims(qt)
    sig = types.void(sc, so, sstride, q, qo, qstride, pool, k0, k1, kstride, hd, vs, nrows, nch, qtype)

    def codegen(context, builder, signature, args):
        data, i64 = _arg_readers(context, builder, signature, args)
        scp, qp, pp, vsp = data(0), data(3), builder.bitcast(data(6), _I8.as_pointer()), data(11)
        so64, ss64, qo64, qs64, ks64, hd64 = i64(1), i64(2), i64(4), i64(5), i64(9), i64(10)
        kbase = [i64(7), i64(8)]
        rows = [[builder.add(kbase[h], builder.mul(_c(u), ks64)) for u in range(16)] for h in range(m)]
        fma = builder.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF, _VF]))
        slots = [[cgutils.alloca_once(builder, _VF) for _ in range(m)] for _ in range(n)]  # registers after mem2reg
        for row in slots:
            for s in row:
                builder.store(ir.Constant(_VF, None), s)
        qrow = [builder.add(qo64, builder.mul(_c(r), qs64)) for r in range(n)]
        with cgutils.for_range(builder, builder.udiv(hd64, _c(32))) as loop:
            boff = builder.mul(loop.index, _c(bb))
            scale = [_key_scales(builder, pp, rows[h], boff) for h in range(m)]
            words = [_key_words(builder, pp, rows[h], builder.add(boff, _c(2)), nw) for h in range(m)]
            d0 = builder.mul(loop.index, _c(32))
            for dd, (wi, j, high) in enumerate(dims):
                kv = [builder.fmul(_code_lanes(builder, words[h][wi], qt, j, high), scale[h]) for h in range(m)]
                for r in range(n):
                    xv = _broadcast(builder, qp, builder.add(qrow[r], builder.add(d0, _c(dd))))
                    for h in range(m):
                        builder.store(builder.call(fma, [xv, kv[h], builder.load(slots[r][h])]), slots[r][h])
        for h in range(m):
            scl = builder.load(_vptr(builder, vsp, _c(16 * h)), align=4)
            for r in range(n):
                at = builder.add(builder.add(so64, builder.mul(_c(r), ss64)), _c(16 * h))
                builder.store(builder.fmul(builder.load(slots[r][h]), scl), _vptr(builder, scp, at), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def pv_lanes_q(typingctx, acc, ao, astride, w, wo, wstride, pool, vo, vstride, d0, nkeys, nrows, nsl, qtype):
    """simd_attn.pv_lanes for a Q8_0 / Q4_0 V pool read in place: value j's dimensions d0 +
    16 s .. + 15 (d0 a multiple of 16) decoded from the row at byte vo + j vstride of pool
    (uint8, flat); qtype a literal GGML type id; nrows, nsl literals 1..4. The same bits as
    pv_lanes on the decoded rows."""
    lits = (nrows, nsl, qtype)
    if not all(isinstance(x, types.IntegerLiteral) for x in lits):
        return None
    n, m, qt = nrows.literal_value, nsl.literal_value, qtype.literal_value
    if not (1 <= n <= 4 and 1 <= m <= 4 and qt in IN_PLACE):
        return None
    if not all(isinstance(a, types.Array) for a in (acc, w, pool)) or pool.dtype != types.uint8:
        return None
    bb = IN_PLACE[qt][0]
    sig = types.void(acc, ao, astride, w, wo, wstride, pool, vo, vstride, d0, nkeys, nrows, nsl, qtype)

    def codegen(context, builder, signature, args):
        data, i64 = _arg_readers(context, builder, signature, args)
        accp, wp, pp = data(0), data(3), builder.bitcast(data(6), _I8.as_pointer())
        ao64, as64, wo64, ws64, vo64, vs64, d064, nk64 = (i64(k) for k in (1, 2, 4, 5, 7, 8, 9, 10))
        fma = builder.module.declare_intrinsic("llvm.fmuladd.v16f32", fnty=ir.FunctionType(_VF, [_VF, _VF, _VF]))
        at = [[builder.add(builder.add(ao64, builder.mul(_c(r), as64)), _c(16 * k)) for k in range(m)] for r in range(n)]
        slots = [[cgutils.alloca_once(builder, _VF) for _ in range(m)] for _ in range(n)]
        for r in range(n):
            for k in range(m):
                builder.store(builder.load(_vptr(builder, accp, at[r][k]), align=4), slots[r][k])
        # each slice's block (byte offset of its scale) and half (Q8_0: the codes' offset; Q4_0: the nibble)
        dim = [builder.add(d064, _c(16 * k)) for k in range(m)]
        blk = [builder.mul(builder.lshr(x, _c(5)), _c(bb)) for x in dim]
        half = [builder.and_(builder.lshr(x, _c(4)), _c(1)) for x in dim]
        codes_at = [builder.add(blk[k], builder.add(_c(2), builder.mul(half[k], _c(16))) if qt == Q8_0 else _c(2))
                    for k in range(m)]
        shift = [builder.insert_element(ir.Constant(_VI, None), builder.trunc(builder.mul(half[k], _c(4)), _I32),
                                        ir.Constant(_I32, 0)) for k in range(m)]
        shift = [builder.shuffle_vector(s, ir.Constant(_VI, None), ir.Constant(_VI, [0] * 16)) for s in shift]
        wrow = [builder.add(wo64, builder.mul(_c(r), ws64)) for r in range(n)]
        v16 = ir.VectorType(_I8, 16)
        with cgutils.for_range(builder, nk64) as loop:
            row = builder.add(vo64, builder.mul(loop.index, vs64))
            vv = []
            for k in range(m):
                d = builder.fpext(builder.bitcast(builder.load(_at(builder, pp, builder.add(row, blk[k]), _I16), align=1),
                                                  ir.HalfType()), _F32)
                dv = builder.shuffle_vector(builder.insert_element(ir.Constant(_VF, None), d, ir.Constant(_I32, 0)),
                                            ir.Constant(_VF, None), ir.Constant(_VI, [0] * 16))
                x = builder.load(_at(builder, pp, builder.add(row, codes_at[k]), v16), align=1)
                if qt == Q8_0:
                    xi = builder.sext(x, _VI)
                else:
                    xi = builder.sub(builder.and_(builder.lshr(builder.zext(x, _VI), shift[k]), _splat_i32(15)), _splat_i32(8))
                vv.append(builder.fmul(builder.sitofp(xi, _VF), dv))
            for r in range(n):
                xv = _broadcast(builder, wp, builder.add(wrow[r], loop.index))
                for k in range(m):
                    builder.store(builder.call(fma, [xv, vv[k], builder.load(slots[r][k])]), slots[r][k])
        for r in range(n):
            for k in range(m):
                builder.store(builder.load(slots[r][k]), _vptr(builder, accp, at[r][k]), align=4)
        return context.get_dummy_value()

    return sig, codegen
