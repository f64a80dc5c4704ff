"""One-time repacking of the IQ1 / IQ2 / IQ3 codebook types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S, IQ1_M) into the K-quant int8 kernel's grid formats (weight_types.GridCodes,
kernels_cpu.simd_dot).

Per group of 16 rows and 256-column super-block, one record of B bytes (KForm.record_bytes):
d f16 [16] | the 4-bit scales s, two per byte, byte-major [subs / 2][16] (sub-block 2j in the
low nibble of byte j) | 8 blocks of 32 columns, each: the grid indices' low bytes [32 / width]
[16], their high bits as 16-bit row masks [index_bits - 8][32 / width], a 64-bit sign mask per
quad (bit 4l + k: row lane l, column 4q + k negative). The file's 7 sign bits per 8 values
(IQ2_XXS, IQ2_XS, IQ3_XXS; the 8th their parity) become 8, the rest keeps the file's bits:
IQ2_S and IQ3_S are their file's size, IQ2_XXS +6%, IQ2_XS +5.4%, IQ3_XXS +4%. IQ1_S and IQ1_M
have no sign masks: each 8 columns' 11-bit index and the sign of their delta make a 12-bit
index into IQ1_DELTA (formats.quants_iq.grid); IQ1_M's f16 d, spread over its scale words in
the file, is assembled here. IQ1_S +8%, IQ1_M +3.6%.
"""

from __future__ import annotations

import numba
import numpy as np

from edge_infer.formats.weight_types import IQ1_M, IQ1_S, IQ2_S, IQ2_XS, IQ2_XXS, IQ3_XXS

from ._jit import kernel, u32_at
from .simd_i8 import GROUP


@kernel(inline=True)
def _seven_signs(sign7, neg, at):
    """neg[at:at + 8]: the 7 stored sign bits of 8 values, the 8th their parity."""
    parity = 0
    for j in range(7):
        bit = (sign7 >> j) & 1
        neg[at + j] = bit
        parity ^= bit
    neg[at + 7] = parity


@kernel(inline=True)
def _grid_row(w, r, o, qtype, sub, idx, neg):
    """Row r's super-block at byte o: its 4-bit scales sub [8 or 16], grid indices idx [32 or
    64, one per 8 or 4 columns] and sign bits neg [256] (1: negative; IQ1: none); returns d's
    f16 bits."""
    if qtype == IQ1_S:  # per 32 columns a u16: 4 x 3 high index bits, a 3-bit scale, the delta's sign
        for ib in range(8):
            qh = np.int64(w[r, o + 34 + 2 * ib]) | (np.int64(w[r, o + 35 + 2 * ib]) << 8)
            sub[ib] = (qh >> 12) & 7
            for j in range(4):
                idx[4 * ib + j] = np.int64(w[r, o + 2 + 4 * ib + j]) | (((qh >> (3 * j)) & 7) << 8) | ((qh >> 15) << 11)
        return np.int64(w[r, o]) | (np.int64(w[r, o + 1]) << 8)
    if qtype == IQ1_M:  # per 8 columns a nibble of qh: 3 high index bits, the delta's sign; 3-bit scales per 16
        sc = np.zeros(4, np.int64)
        for k in range(4):
            sc[k] = np.int64(w[r, o + 48 + 2 * k]) | (np.int64(w[r, o + 49 + 2 * k]) << 8)
        for j in range(16):
            sub[j] = (sc[j // 4] >> (3 * (j % 4))) & 7
        for g in range(32):
            h = np.int64(w[r, o + 32 + g // 2]) >> (4 * (g % 2))
            idx[g] = np.int64(w[r, o + g]) | ((h & 7) << 8) | (((h >> 3) & 1) << 11)
        return (sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000)
    if qtype == IQ2_XXS or qtype == IQ3_XXS:  # per 32 columns a u32 of 4 x 7 sign bits and s
        rows = 4 if qtype == IQ2_XXS else 8  # index bytes per 32 columns
        for ib in range(8):
            at = o + 2 + 8 * ib if qtype == IQ2_XXS else o + 2 + 64 + 4 * ib
            aux = u32_at(w, r, at + 4 if qtype == IQ2_XXS else at)
            sub[ib] = aux >> 28
            for j in range(rows):  # IQ2_XXS: 4 index bytes then aux per 32; IQ3_XXS: 64 index bytes, then the aux
                idx[rows * ib + j] = w[r, o + 2 + 8 * ib + j]
            for g in range(4):
                _seven_signs((aux >> (7 * g)) & 127, neg, 32 * ib + 8 * g)
    elif qtype == IQ2_XS:  # u16 per 8 columns: 9-bit index, 7 sign bits; two 4-bit scales per 32
        for g in range(32):
            q = np.uint32(w[r, o + 2 + 2 * g]) | (np.uint32(w[r, o + 3 + 2 * g]) << 8)
            idx[g] = q & 511
            _seven_signs(q >> 9, neg, 8 * g)
        for ib in range(8):
            sub[2 * ib], sub[2 * ib + 1] = w[r, o + 66 + ib] & 15, w[r, o + 66 + ib] >> 4
    elif qtype == IQ2_S:  # index bytes, sign bytes, 2 high index bits per 8 columns, scales
        for g in range(32):
            ib, m = g // 4, g % 4
            idx[g] = np.uint32(w[r, o + 2 + g]) | ((np.uint32(w[r, o + 66 + ib]) << (8 - 2 * m)) & 0x300)
            for j in range(8):
                neg[8 * g + j] = (w[r, o + 34 + g] >> j) & 1
        for ib in range(8):
            sub[2 * ib], sub[2 * ib + 1] = w[r, o + 74 + ib] & 15, w[r, o + 74 + ib] >> 4
    else:  # IQ3_S: index bytes, their 9th bits, sign bytes, two 4-bit scales per 64 columns
        for k in range(64):
            idx[k] = np.uint32(w[r, o + 2 + k]) | (((np.uint32(w[r, o + 66 + k // 8]) >> (k % 8)) & 1) << 8)
        for k8 in range(32):
            for j in range(8):
                neg[8 * k8 + j] = (w[r, o + 74 + k8] >> j) & 1
        for ib in range(8):
            sub[ib] = (w[r, o + 106 + ib // 2] >> (4 * (ib % 2))) & 15
    return np.int64(w[r, o]) | (np.int64(w[r, o + 1]) << 8)  # d, the first field of each


@kernel(parallel=True)
def repack_grid_kernel(w, qtype, fb, width, index_bits, signed, head, blk, wk):
    """w uint8 [R, S * fb] (fb: the file's bytes per super-block) -> wk uint8 [G, S, B] (module
    docstring; width, index_bits, signed as the type's GridCodes, head its header bytes, blk its
    block bytes); rows past R stay zero."""
    R = w.shape[0]
    S = wk.shape[1]
    n = 32 // width  # index vectors per block
    high = index_bits - 8
    n_sub = (head - 32) // 8  # 4-bit scales per row: two per byte of the 16 rows
    for g in numba.prange(wk.shape[0]):
        sub = np.zeros(16, np.uint32)
        idx = np.zeros(64, np.uint32)
        neg = np.zeros(256, np.uint32)
        for ln in range(min(GROUP, R - g * GROUP)):
            r = g * GROUP + ln
            for s in range(S):
                o = s * fb
                dst = wk[g, s]
                d16 = _grid_row(w, r, o, qtype, sub, idx, neg)
                dst[2 * ln], dst[2 * ln + 1] = np.uint8(d16 & 255), np.uint8(d16 >> 8)
                for j in range(n_sub // 2):
                    dst[32 + 16 * j + ln] = np.uint8(sub[2 * j] | (sub[2 * j + 1] << 4))
                for b in range(8):
                    at = head + b * blk
                    for v in range(n):
                        i = idx[b * n + v]
                        dst[at + 16 * v + ln] = np.uint8(i & 255)
                        for k in range(high):
                            m = at + 16 * n + 2 * (k * n + v) + ln // 8
                            dst[m] = dst[m] | np.uint8(((i >> (8 + k)) & 1) << (ln % 8))
                    if not signed:
                        continue
                    signs = at + 16 * n + 2 * high * n
                    for q in range(8):
                        for kk in range(4):
                            bit = 4 * ln + kk
                            m = signs + 8 * q + bit // 8
                            dst[m] = dst[m] | np.uint8(neg[32 * b + 4 * q + kk] << (bit % 8))
