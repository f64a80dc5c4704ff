"""Row decoders of the non-linear and codebook types (IQ4_NL, IQ4_XS, IQ2/IQ3/IQ1, TQ1_0, TQ2_0,
MXFP4): one GGUF row -> float32, the float path's decoders (kernels_cpu.dequant.decode_rows
dispatches here). Each computes exactly the float32 operations of formats.quants_iq (itself
bit-exact with ggml), so a decoded row is bit-identical to `dequantize()` of the same bytes.

Signature of each: `decode_<type>(w: uint8[R, row_bytes], r, out: float32[M, n], i)` decodes
row r of w into row i of out. The codebooks and sign patterns are module-level arrays, which
numba compiles in as constants.
"""

from __future__ import annotations

import numpy as np

from edge_infer.formats.quants_iq import IQ1_DELTA, IQ4_VALUES, MXFP4_VALUES, e8m0_half, grid, sign_patterns

from ._jit import f16_to_f32, half_at, kernel, u16_at, u32_at

GRID_IQ2_XXS = grid("IQ2_XXS")  # (256, 8) float32
GRID_IQ2_XS = grid("IQ2_XS")  # (512, 8)
GRID_IQ2_S = grid("IQ2_S")  # (1024, 8)
GRID_IQ3_XXS = grid("IQ3_XXS")  # (256, 4)
GRID_IQ3_S = grid("IQ3_S")  # (512, 4)
GRID_IQ1_S = grid("IQ1_S")  # (2048, 8): -1, 0, 1
SIGNS = sign_patterns()  # (128, 8) +-1
PLUS_MINUS = np.array([1, -1], np.float32)  # a sign bit's factor (multiplied: a NaN keeps its sign)
KV_IQ4 = IQ4_VALUES.astype(np.float32)
KV_MXFP4 = MXFP4_VALUES.astype(np.float32)
DELTA = np.float32(IQ1_DELTA)
E8M0_HALF = e8m0_half(np.arange(256, dtype=np.uint8))  # MXFP4's scale byte -> float32 (halved)


@kernel(inline=True)
def _u16(w, r, o):
    return np.uint32(u16_at(w, r, o))  # widened: the decoders shift it within 32 bits


@kernel(inline=True)
def _scale_half(d, s, last):
    """ggml's `d * (0.5f + s) * last`."""
    return (d * (np.float32(0.5) + np.float32(s))) * last


@kernel
def decode_iq2_xxs(w, r, out, i):
    # d | qs: per 32 values a u32 of four grid rows, a u32 of 4 x 7 sign bits and a 4-bit scale
    for b in range(out.shape[1] // 256):
        o = b * 66
        d = half_at(w, r, o)
        for g in range(8):
            aux = u32_at(w, r, o + 2 + 8 * g + 4)
            db = _scale_half(d, aux >> np.uint32(28), np.float32(0.25))
            for gr in range(4):
                row = w[r, o + 2 + 8 * g + gr]
                s = (aux >> np.uint32(7 * gr)) & np.uint32(127)
                for j in range(8):
                    out[i, b * 256 + 32 * g + 8 * gr + j] = (db * GRID_IQ2_XXS[row, j]) * SIGNS[s, j]


@kernel
def decode_iq2_xs(w, r, out, i):
    # d | qs: 32 x u16 (9-bit grid row, 7 sign bits) | scales: 8 x u8 (two 4-bit scales)
    for b in range(out.shape[1] // 256):
        o = b * 74
        d = half_at(w, r, o)
        for g in range(8):
            sc = np.uint32(w[r, o + 66 + g])
            for gr in range(4):
                db = _scale_half(d, (sc >> np.uint32(4 * (gr // 2))) & np.uint32(15), np.float32(0.25))
                q = _u16(w, r, o + 2 + 2 * (4 * g + gr))
                row, s = q & np.uint32(511), q >> np.uint32(9)
                for j in range(8):
                    out[i, b * 256 + 32 * g + 8 * gr + j] = (db * GRID_IQ2_XS[row, j]) * SIGNS[s, j]


@kernel
def decode_iq2_s(w, r, out, i):
    # d | qs: 32 grid-row bytes, then 32 sign bytes | qh: 8 (2 high row bits each) | scales: 8
    for b in range(out.shape[1] // 256):
        o = b * 82
        d = half_at(w, r, o)
        for g in range(8):
            sc = np.uint32(w[r, o + 74 + g])
            qh = np.uint32(w[r, o + 66 + g])
            for gr in range(4):
                db = _scale_half(d, (sc >> np.uint32(4 * (gr // 2))) & np.uint32(15), np.float32(0.25))
                row = np.uint32(w[r, o + 2 + 4 * g + gr]) | ((qh << np.uint32(8 - 2 * gr)) & np.uint32(0x300))
                signs = np.uint32(w[r, o + 34 + 4 * g + gr])
                for j in range(8):
                    sign = PLUS_MINUS[(signs >> np.uint32(j)) & np.uint32(1)]
                    out[i, b * 256 + 32 * g + 8 * gr + j] = (db * GRID_IQ2_S[row, j]) * sign


@kernel
def decode_iq3_xxs(w, r, out, i):
    # d | qs: 64 bytes of 4-wide grid rows | 8 x u32 (4 x 7 sign bits, a 4-bit scale)
    for b in range(out.shape[1] // 256):
        o = b * 98
        d = half_at(w, r, o)
        for g in range(8):
            aux = u32_at(w, r, o + 66 + 4 * g)
            db = _scale_half(d, aux >> np.uint32(28), np.float32(0.5))
            for gr in range(4):
                s = (aux >> np.uint32(7 * gr)) & np.uint32(127)
                for h in range(2):
                    row = w[r, o + 2 + 8 * g + 2 * gr + h]
                    for j in range(4):
                        out[i, b * 256 + 32 * g + 8 * gr + 4 * h + j] = (db * GRID_IQ3_XXS[row, j]) * SIGNS[s, 4 * h + j]


@kernel
def decode_iq3_s(w, r, out, i):
    # d | qs: 64 | qh: 8 (bit k: bit 8 of row k) | signs: 32 | scales: 4 (two 4-bit scales each)
    for b in range(out.shape[1] // 256):
        o = b * 110
        d = half_at(w, r, o)
        for g in range(8):
            sc = (np.int32(w[r, o + 106 + g // 2]) >> np.int32(4 * (g % 2))) & np.int32(15)
            db = d * np.float32(np.int32(1 + 2 * sc))
            qh = np.uint32(w[r, o + 66 + g])
            for k in range(8):
                row = np.uint32(w[r, o + 2 + 8 * g + k]) | (((qh >> np.uint32(k)) & np.uint32(1)) << np.uint32(8))
                signs = np.uint32(w[r, o + 74 + 4 * g + k // 2])
                for j in range(4):
                    sign = PLUS_MINUS[(signs >> np.uint32(4 * (k % 2) + j)) & np.uint32(1)]
                    out[i, b * 256 + 32 * g + 4 * k + j] = (db * GRID_IQ3_S[row, j]) * sign


@kernel
def decode_iq1_s(w, r, out, i):
    # d | qs: 32 (grid row low bytes) | qh: 8 x u16 (4 x 3 high row bits, 3-bit scale, sign)
    for b in range(out.shape[1] // 256):
        o = b * 50
        d = half_at(w, r, o)
        for g in range(8):
            qh = _u16(w, r, o + 34 + 2 * g)
            dl = d * np.float32(np.int32(2 * ((qh >> np.uint32(12)) & np.uint32(7)) + 1))
            delta = -DELTA if qh & np.uint32(0x8000) else DELTA
            for gr in range(4):
                row = np.uint32(w[r, o + 2 + 4 * g + gr]) | (((qh >> np.uint32(3 * gr)) & np.uint32(7)) << np.uint32(8))
                for j in range(8):
                    out[i, b * 256 + 32 * g + 8 * gr + j] = dl * (GRID_IQ1_S[row, j] + delta)


@kernel
def decode_iq1_m(w, r, out, i):
    # qs: 32 | qh: 16 (per 16 values: two 3-bit high row parts and their delta signs) | scales: 8
    for b in range(out.shape[1] // 256):
        o = b * 56
        s0, s1, s2, s3 = _u16(w, r, o + 48), _u16(w, r, o + 50), _u16(w, r, o + 52), _u16(w, r, o + 54)
        d16 = ((s0 >> np.uint32(12)) | ((s1 >> np.uint32(8)) & np.uint32(0x00F0))
               | ((s2 >> np.uint32(4)) & np.uint32(0x0F00)) | (s3 & np.uint32(0xF000)))
        d = f16_to_f32(np.uint16(d16))
        for g in range(8):
            sc = _u16(w, r, o + 48 + 2 * (g // 2))
            for half in range(2):  # 16 values each: dl1, then dl2
                shift = np.uint32(6 * (g % 2) + 3 * half)
                dl = d * np.float32(np.int32(2 * ((sc >> shift) & np.uint32(7)) + 1))
                qh = np.uint32(w[r, o + 32 + 2 * g + half])
                for gr in range(2):
                    row = np.uint32(w[r, o + 4 * g + 2 * half + gr]) | ((qh << np.uint32(8 - 4 * gr)) & np.uint32(0x700))
                    delta = -DELTA if qh & np.uint32(0x08 << (4 * gr)) else DELTA
                    for j in range(8):
                        out[i, b * 256 + 32 * g + 16 * half + 8 * gr + j] = dl * (GRID_IQ1_S[row, j] + delta)


@kernel(inline=True)  # also inlined in kernels_cpu.kv_read's loop over a chunk's rows
def decode_iq4_nl(w, r, out, i):
    for b in range(out.shape[1] // 32):
        o = b * 18
        d = half_at(w, r, o)
        for j in range(16):
            q = w[r, o + 2 + j]
            out[i, b * 32 + j] = d * KV_IQ4[q & 15]
            out[i, b * 32 + 16 + j] = d * KV_IQ4[q >> 4]


@kernel
def decode_iq4_xs(w, r, out, i):
    # d | scales_h: u16 | scales_l: 4 | qs: 128
    for b in range(out.shape[1] // 256):
        o = b * 136
        d = half_at(w, r, o)
        sh = _u16(w, r, o + 2)
        for g in range(8):
            lo = (np.int32(w[r, o + 4 + g // 2]) >> np.int32(4 * (g % 2))) & np.int32(15)
            hi = np.int32((sh >> np.uint32(2 * g)) & np.uint32(3))
            dl = d * np.float32(np.int32((lo | (hi << 4)) - 32))
            for j in range(16):
                q = w[r, o + 8 + 16 * g + j]
                out[i, b * 256 + 32 * g + j] = dl * KV_IQ4[q & 15]
                out[i, b * 256 + 32 * g + 16 + j] = dl * KV_IQ4[q >> 4]


@kernel(inline=True)
def _trit(q, p):
    """Base-3 digit of TQ1_0's byte q at place p (q * 3^p wraps to a byte, then * 3 >> 8)."""
    return np.int32((np.uint32(np.uint8(np.uint32(q) * np.uint32(p))) * np.uint32(3)) >> np.uint32(8))


@kernel
def decode_tq1_0(w, r, out, i):
    # qs: 48 (5 trits a byte) | qh: 4 (4 trits a byte) | d
    for b in range(out.shape[1] // 256):
        o = b * 54
        d = half_at(w, r, o + 52)
        k = b * 256
        p = 1
        for n in range(5):
            for m in range(32):
                out[i, k + 32 * n + m] = np.float32(_trit(w[r, o + m], p) - 1) * d
            for m in range(16):
                out[i, k + 160 + 16 * n + m] = np.float32(_trit(w[r, o + 32 + m], p) - 1) * d
            if n < 4:
                for m in range(4):
                    out[i, k + 240 + 4 * n + m] = np.float32(_trit(w[r, o + 48 + m], p) - 1) * d
            p *= 3


@kernel
def decode_tq2_0(w, r, out, i):
    # qs: 64 (4 crumbs a byte) | d
    for b in range(out.shape[1] // 256):
        o = b * 66
        d = half_at(w, r, o + 64)
        for h in range(2):
            for gr in range(4):
                for m in range(32):
                    q = (np.int32(w[r, o + 32 * h + m]) >> np.int32(2 * gr)) & np.int32(3)
                    out[i, b * 256 + 128 * h + 32 * gr + m] = np.float32(q - 1) * d


@kernel
def decode_mxfp4(w, r, out, i):
    # e: E8M0 | qs: 16
    for b in range(out.shape[1] // 32):
        o = b * 17
        d = E8M0_HALF[w[r, o]]
        for j in range(16):
            q = w[r, o + 1 + j]
            out[i, b * 32 + j] = KV_MXFP4[q & 15] * d
            out[i, b * 32 + 16 + j] = KV_MXFP4[q >> 4] * d
