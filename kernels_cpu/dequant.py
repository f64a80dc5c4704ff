"""Row decoders: one GGUF row (uint8 bytes in the file's block layout) -> float32 values.

Every decoder computes exactly the float32 operations of the reference dequantizer
(`edge_infer.formats.quants`, itself bit-exact with gguf-py), so a decoded row is bit-identical
to `dequantize()` of the same bytes. Block layouts are drawn in formats/weight_types.py.

Signature of each: `decode_<type>(w: uint8[R, row_bytes], r, out: float32[M, n], i)` decodes
row r of w into row i of out. (Indexing the 2-D arrays directly, instead of passing row views,
avoids a reference-counted view per row: that alone was half the cost of a decoded block.)
`decode_rows(qtype, w, r, out, i)` dispatches on the GGML type id; `decode_row(qtype, row, out)`
is the 1-D convenience form.
"""

from __future__ import annotations

import numpy as np

from edge_infer.formats.weight_types import (
    BF16,
    F16,
    F32,
    IQ1_M,
    IQ1_S,
    IQ2_S,
    IQ2_XS,
    IQ2_XXS,
    IQ3_S,
    IQ3_XXS,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    Q8_K,
    TQ1_0,
    TQ2_0,
    TYPES,
)

from ._jit import bf16_to_f32, bit_at, f16_to_f32, half_at, kernel, u16_at
from .dequant_iq import (
    decode_iq1_m,
    decode_iq1_s,
    decode_iq2_s,
    decode_iq2_xs,
    decode_iq2_xxs,
    decode_iq3_s,
    decode_iq3_xxs,
    decode_iq4_nl,
    decode_iq4_xs,
    decode_mxfp4,
    decode_tq1_0,
    decode_tq2_0,
)

# The GGML type ids above (formats.weight_types' records, re-exported here for the kernels and
# their callers): decode_rows takes every one of them.
KERNEL_TYPES = tuple(t.id for t in TYPES)
BLOCK_SHAPE = {t.id: (t.block_size, t.type_size) for t in TYPES}  # (elements per block, bytes per block)


@kernel
def decode_f32(w, r, out, i):
    v = w[r].view(np.float32)
    for k in range(out.shape[1]):
        out[i, k] = v[k]


@kernel
def decode_f16(w, r, out, i):
    # the two bytes combined by hand: a per-row `w[r].view(np.uint16)` cost more than the
    # conversion itself (LLVM folds this back into one 16-bit load per element)
    for k in range(out.shape[1]):
        out[i, k] = f16_to_f32(u16_at(w, r, 2 * k))


@kernel
def decode_bf16(w, r, out, i):
    v = w[r].view(np.uint16)
    for k in range(out.shape[1]):
        out[i, k] = bf16_to_f32(v[k])


@kernel(inline=True)  # also inlined in kernels_cpu.kv_read's loop over a chunk's rows
def decode_q4_0(w, r, out, i):
    for b in range(out.shape[1] // 32):
        o = b * 18
        d = half_at(w, r, o)
        for j in range(16):
            q = np.int32(w[r, o + 2 + j])
            out[i, b * 32 + j] = d * np.float32(np.int32((q & 15) - 8))
            out[i, b * 32 + 16 + j] = d * np.float32(np.int32((q >> 4) - 8))


@kernel(inline=True)  # also inlined in kernels_cpu.kv_read's loop over a chunk's rows
def decode_q4_1(w, r, out, i):
    for b in range(out.shape[1] // 32):
        o = b * 20
        d = half_at(w, r, o)
        m = half_at(w, r, o + 2)
        for j in range(16):
            q = np.int32(w[r, o + 4 + j])
            out[i, b * 32 + j] = d * np.float32(np.int32(q & 15)) + m
            out[i, b * 32 + 16 + j] = d * np.float32(np.int32(q >> 4)) + m


@kernel(inline=True)
def _qh32(w, r, o):
    return (np.uint32(w[r, o]) | (np.uint32(w[r, o + 1]) << np.uint32(8))
            | (np.uint32(w[r, o + 2]) << np.uint32(16)) | (np.uint32(w[r, o + 3]) << np.uint32(24)))


@kernel(inline=True)  # also inlined in kernels_cpu.kv_read's loop over a chunk's rows
def decode_q5_0(w, r, out, i):
    for b in range(out.shape[1] // 32):
        o = b * 22
        d = half_at(w, r, o)
        qh = _qh32(w, r, o + 2)
        for j in range(16):
            q = np.int32(w[r, o + 6 + j])
            lo = np.int32(np.int32(q & 15) | np.int32(bit_at(qh, j) << 4))
            hi = np.int32(np.int32(q >> 4) | np.int32(bit_at(qh, j + 16) << 4))
            out[i, b * 32 + j] = d * np.float32(np.int32(lo - 16))
            out[i, b * 32 + 16 + j] = d * np.float32(np.int32(hi - 16))


@kernel(inline=True)  # also inlined in kernels_cpu.kv_read's loop over a chunk's rows
def decode_q5_1(w, r, out, i):
    for b in range(out.shape[1] // 32):
        o = b * 24
        d = half_at(w, r, o)
        m = half_at(w, r, o + 2)
        qh = _qh32(w, r, o + 4)
        for j in range(16):
            q = np.int32(w[r, o + 8 + j])
            lo = np.int32(np.int32(q & 15) | np.int32(bit_at(qh, j) << 4))
            hi = np.int32(np.int32(q >> 4) | np.int32(bit_at(qh, j + 16) << 4))
            out[i, b * 32 + j] = d * np.float32(lo) + m
            out[i, b * 32 + 16 + j] = d * np.float32(hi) + m


@kernel(inline=True)  # also inlined in kernels_cpu.kv_read's loop over a chunk's rows
def decode_q8_0(w, r, out, i):
    for b in range(out.shape[1] // 32):
        o = b * 34
        d = half_at(w, r, o)
        for j in range(32):
            out[i, b * 32 + j] = np.float32(np.int8(w[r, o + 2 + j])) * d


@kernel
def decode_q2_k(w, r, out, i):
    # scales[16] | qs[64] | d | dmin
    for b in range(out.shape[1] // 256):
        o = b * 84
        d = half_at(w, r, o + 80)
        dmin = half_at(w, r, o + 82)
        for s in range(16):  # sub-blocks of 16: half h, shift pair sh, 16-wide slice
            sc = np.int32(w[r, o + s])
            dl = d * np.float32(np.int32(sc & 15))
            ml = dmin * np.float32(np.int32(sc >> 4))
            h, t = s // 8, s % 8
            shift, base = (t // 2) * 2, (t % 2) * 16
            for j in range(16):
                q = np.int32(w[r, o + 16 + h * 32 + base + j])
                out[i, b * 256 + s * 16 + j] = dl * np.float32(np.int32((q >> shift) & 3)) - ml


@kernel(inline=True)
def _k_scales(w, r, s, c):
    """6-bit (scale, min) of sub-blocks 2c and 2c + 1 from the 12 packed bytes at w[r, s:s+12]:
    sub-blocks j < 4 take the low 6 bits of bytes j (scale) and j + 4 (min); j >= 4 combine a
    nibble of byte j + 4 with the top 2 bits of bytes j - 4 (scale) and j (min)."""
    j0, j1 = 2 * c, 2 * c + 1
    if c < 2:
        sc0 = np.int32(w[r, s + j0]) & 63
        m0 = np.int32(w[r, s + 4 + j0]) & 63
        sc1 = np.int32(w[r, s + j1]) & 63
        m1 = np.int32(w[r, s + 4 + j1]) & 63
    else:
        sc0 = (np.int32(w[r, s + 4 + j0]) & 15) | ((np.int32(w[r, s + j0 - 4]) >> 6) << 4)
        m0 = (np.int32(w[r, s + 4 + j0]) >> 4) | ((np.int32(w[r, s + j0]) >> 6) << 4)
        sc1 = (np.int32(w[r, s + 4 + j1]) & 15) | ((np.int32(w[r, s + j1 - 4]) >> 6) << 4)
        m1 = (np.int32(w[r, s + 4 + j1]) >> 4) | ((np.int32(w[r, s + j1]) >> 6) << 4)
    return sc0, m0, sc1, m1


@kernel
def decode_q3_k(w, r, out, i):
    # hmask[32] | qs[64] | scales[12] | d
    for b in range(out.shape[1] // 256):
        o = b * 110
        d = half_at(w, r, o + 108)
        for s in range(16):
            if s < 8:
                lo = np.int32(w[r, o + 96 + s]) & 15
            else:
                lo = np.int32(w[r, o + 96 + s - 8]) >> 4
            hi = (np.int32(w[r, o + 104 + s % 4]) >> (2 * (s // 4))) & 3
            dl = d * np.float32(np.int32((lo | (hi << 4)) - 32))
            h, t = s // 8, s % 8
            shift, base = (t // 2) * 2, (t % 2) * 16
            bit = s // 2  # hmask bit: sub-block pairs of 32 elements
            for j in range(16):
                ql = (np.int32(w[r, o + 32 + h * 32 + base + j]) >> shift) & 3
                hm = (np.int32(w[r, o + base + j]) >> bit) & 1
                out[i, b * 256 + s * 16 + j] = dl * np.float32(np.int32(ql - ((hm ^ 1) << 2)))


@kernel
def decode_q4_k(w, r, out, i):
    # d | dmin | scales[12] | qs[128]
    for b in range(out.shape[1] // 256):
        o = b * 144
        d = half_at(w, r, o)
        dmin = half_at(w, r, o + 2)
        for c in range(4):
            sc0, m0, sc1, m1 = _k_scales(w, r, o + 4, c)
            d0, dm0 = d * np.float32(sc0), dmin * np.float32(m0)
            d1, dm1 = d * np.float32(sc1), dmin * np.float32(m1)
            for j in range(32):
                q = np.int32(w[r, o + 16 + c * 32 + j])
                out[i, b * 256 + c * 64 + j] = d0 * np.float32(np.int32(q & 15)) - dm0
                out[i, b * 256 + c * 64 + 32 + j] = d1 * np.float32(np.int32(q >> 4)) - dm1


@kernel
def decode_q5_k(w, r, out, i):
    # d | dmin | scales[12] | qh[32] | qs[128]
    for b in range(out.shape[1] // 256):
        o = b * 176
        d = half_at(w, r, o)
        dmin = half_at(w, r, o + 2)
        for c in range(4):
            sc0, m0, sc1, m1 = _k_scales(w, r, o + 4, c)
            d0, dm0 = d * np.float32(sc0), dmin * np.float32(m0)
            d1, dm1 = d * np.float32(sc1), dmin * np.float32(m1)
            for j in range(32):
                q = np.int32(w[r, o + 48 + c * 32 + j])
                h = w[r, o + 16 + j]
                lo = np.int32(np.int32(q & 15) | np.int32(bit_at(h, 2 * c) << 4))
                hi = np.int32(np.int32(q >> 4) | np.int32(bit_at(h, 2 * c + 1) << 4))
                out[i, b * 256 + c * 64 + j] = d0 * np.float32(lo) - dm0
                out[i, b * 256 + c * 64 + 32 + j] = d1 * np.float32(hi) - dm1


@kernel
def decode_q6_k(w, r, out, i):
    # ql[128] | qh[64] | scales[16] (int8) | d
    for b in range(out.shape[1] // 256):
        o = b * 210
        d = half_at(w, r, o + 208)
        for h in range(2):  # halves of 128 elements
            for s in range(4):  # 32-element slices: low/high nibble of ql, qh bit pair s
                for g in range(2):  # 16-element sub-blocks with their own scale
                    si = h * 8 + s * 2 + g
                    dl = d * np.float32(np.int8(w[r, o + 192 + si]))
                    for j in range(16):
                        idx = g * 16 + j
                        ql = (np.int32(w[r, o + h * 64 + (s % 2) * 32 + idx]) >> (4 * (s // 2))) & 15
                        qh = (np.int32(w[r, o + 128 + h * 32 + idx]) >> (2 * s)) & 3
                        out[i, b * 256 + h * 128 + s * 32 + idx] = dl * np.float32(np.int32((ql | (qh << 4)) - 32))


@kernel
def decode_q8_k(w, r, out, i):
    # d (f32) | qs[256] (int8) | bsums[16] (int16)
    for b in range(out.shape[1] // 256):
        o = b * 292
        d = w[r, o : o + 4].view(np.float32)[0]
        for j in range(256):
            out[i, b * 256 + j] = d * np.float32(np.int8(w[r, o + 4 + j]))


@kernel
def decode_rows(qtype, w, r, out, i):
    """Decode row r of w (any kernel type) into row i of out."""
    if qtype == Q4_1:
        decode_q4_1(w, r, out, i)
    elif qtype == Q8_0:
        decode_q8_0(w, r, out, i)
    elif qtype == Q5_0:
        decode_q5_0(w, r, out, i)
    elif qtype == Q4_K:
        decode_q4_k(w, r, out, i)
    elif qtype == Q6_K:
        decode_q6_k(w, r, out, i)
    elif qtype == Q4_0:
        decode_q4_0(w, r, out, i)
    elif qtype == Q5_1:
        decode_q5_1(w, r, out, i)
    elif qtype == Q5_K:
        decode_q5_k(w, r, out, i)
    elif qtype == Q3_K:
        decode_q3_k(w, r, out, i)
    elif qtype == Q2_K:
        decode_q2_k(w, r, out, i)
    elif qtype == Q8_K:
        decode_q8_k(w, r, out, i)
    elif qtype == F32:
        decode_f32(w, r, out, i)
    elif qtype == F16:
        decode_f16(w, r, out, i)
    elif qtype == BF16:
        decode_bf16(w, r, out, i)
    else:
        decode_iq_rows(qtype, w, r, out, i)


@kernel
def decode_iq_rows(qtype, w, r, out, i):
    """decode_rows for the non-linear and codebook types (kernels_cpu.dequant_iq)."""
    if qtype == IQ4_XS:
        decode_iq4_xs(w, r, out, i)
    elif qtype == IQ4_NL:
        decode_iq4_nl(w, r, out, i)
    elif qtype == IQ2_XXS:
        decode_iq2_xxs(w, r, out, i)
    elif qtype == IQ2_XS:
        decode_iq2_xs(w, r, out, i)
    elif qtype == IQ2_S:
        decode_iq2_s(w, r, out, i)
    elif qtype == IQ3_XXS:
        decode_iq3_xxs(w, r, out, i)
    elif qtype == IQ3_S:
        decode_iq3_s(w, r, out, i)
    elif qtype == IQ1_S:
        decode_iq1_s(w, r, out, i)
    elif qtype == IQ1_M:
        decode_iq1_m(w, r, out, i)
    elif qtype == TQ1_0:
        decode_tq1_0(w, r, out, i)
    elif qtype == TQ2_0:
        decode_tq2_0(w, r, out, i)
    elif qtype == MXFP4:
        decode_mxfp4(w, r, out, i)
    else:
        raise ValueError("decode_rows: unsupported GGML type")


@kernel
def decode_row(qtype, row, out):
    """Decode one 1-D row of any kernel type into `out` (the row's element count)."""
    decode_rows(qtype, row.reshape(1, row.shape[0]), 0, out.reshape(1, out.shape[0]), 0)
