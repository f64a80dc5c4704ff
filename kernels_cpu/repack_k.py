"""One-time repacking of K-quant rows (Q4_K, Q5_K, Q6_K, IQ4_XS: 256-column super-blocks) into
the K-quant int8 kernel's layout (kernels_cpu.matmul_k), the file's size (Q4_K +2.8%, Q5_K +2.3%,
IQ4_XS +1.5%: their scales as bytes).

Per group of 16 rows and super-block, one contiguous record of B bytes (one stream to read):
- Q4_K, B = 2368 = 16 x 148: d f16 [16] | dmin f16 [16] | the sub-block scales sc uint8 [8][16] |
  the mins m uint8 [8][16] (the file's 12 packed bytes of 6-bit values unpacked, so a GEMV makes
  each block's float scales in its loop from one byte load: simd_tile.MODE_MIN_INLINE) | 8
  sub-blocks of 32 columns in matmul_i8's 4-bit format (256 bytes each);
- Q5_K, B = 2880 = 16 x 180: the same header, sub-blocks in the 5-bit format (320 bytes);
- Q6_K, B = 3360 = 16 x 210: d f16 [16] | int8 scales per 16 columns, byte-major [16][16] | 8
  blocks of 32 columns in the 6-bit format (384 bytes: the 4-bit nibbles, then a 64-bit mask
  per quad of the fifth bits and one of the sixth, or without mask registers the two high
  bits as 2-bit fields of 128 bytes, simd_isa.HIGH_BITS_AS_MASKS);
- IQ4_XS, B = 2208 (the file's 16 x 136 + 32): d f16 [16] | sc - 32 as int8 per 32 columns,
  byte-major [8][16] (unpacked from the file's 6-bit scales) | 8 blocks of the 4-bit format,
  whose codes index IQ4_NL's table (the kernel's table format);
- IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: kernels_cpu.repack_grid's grid formats;
- TQ2_0 and TQ1_0, B = 1056 (TQ2_0's 16 x 66; TQ1_0's 16 x 54 + 22%): d f16 [16] | 8 blocks
  of 2-bit codes (128 bytes: quad q in bits 2(q % 4).. of the 64 bytes at 64 (q // 4)), the
  ternary digit t of weight d * (t - 1) (TQ1_0's base-3 digits unpacked).
Codes are the file's unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, whose weight is
d * sc * (code - 32)); d and dmin stay f16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from edge_infer.formats.weight_types import IQ4_XS, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0, TYPES, KForm, weight_type

from ._jit import kernel
from .repack_grid import repack_grid_kernel
from .simd_dot import table_format
from .simd_i8 import GROUP
from .simd_isa import HIGH_BITS_AS_MASKS

# qtype -> (record bytes per group and super-block, code bits, header bytes), from
# formats.weight_types' K-quant forms
K_FORMATS = {t.id: (t.k.record_bytes, t.k.bits, t.k.header_bytes) for t in TYPES if t.k is not None}
FILE_BYTES = {t.id: t.type_size for t in TYPES if t.k is not None}  # per row and super-block, in the file


def k_form(qtype: int) -> KForm:
    """The K-quant form of GGML type qtype (ValueError for a type without one)."""
    form = weight_type(qtype).k
    if form is None:
        raise ValueError(f"{weight_type(qtype).name} has no K-quant form")
    return form


@dataclass(frozen=True, slots=True)
class KWeights:
    """A K-quant matrix in matmul_k's layout: wk uint8 [G, S, B] (G row groups of 16, S
    super-blocks of 256 columns), qtype the GGML type."""

    wk: np.ndarray
    qtype: int

    @property
    def nbytes(self) -> int:
        """Bytes a product with this matrix reads (the file's bytes, rounded up to 16 rows)."""
        return self.wk.nbytes

    @property
    def args(self) -> tuple[np.ndarray, int, int, int]:
        """The matrix's arguments to matmul_k's kernels: (wk, qtype, code format (bits or a
        table format, simd_i8), header bytes)."""
        form = k_form(self.qtype)
        return self.wk, self.qtype, table_format(form.bits, form.table, form.grid), form.header_bytes


@kernel(inline=True)
def _row_codes(w, r, o, qtype, codes):
    """The 256 unsigned codes of row r's super-block at byte o, in column order."""
    if qtype == TQ2_0:  # column 128j + 32l + m: bits 2l..2l+1 of qs[32j + m]
        for j in range(2):
            for sh in range(4):
                for m in range(32):
                    codes[128 * j + 32 * sh + m] = (w[r, o + 32 * j + m] >> (2 * sh)) & 3
    elif qtype == TQ1_0:  # base-3 digits: digit n of byte v is (uint8(v * 3^n) * 3) >> 8
        for n in range(5):
            p3 = 3**n
            for m in range(32):
                codes[32 * n + m] = ((np.uint32(w[r, o + m]) * p3 & 255) * 3) >> 8
            for m in range(16):
                codes[160 + 16 * n + m] = ((np.uint32(w[r, o + 32 + m]) * p3 & 255) * 3) >> 8
        for n in range(4):
            p3 = 3**n
            for j in range(4):
                codes[240 + 4 * n + j] = ((np.uint32(w[r, o + 48 + j]) * p3 & 255) * 3) >> 8
    elif qtype == IQ4_XS:  # per 32 columns 16 bytes (as IQ4_NL): lo = column j, hi = j + 16
        for ib in range(8):
            for j in range(16):
                q = w[r, o + 8 + 16 * ib + j]
                codes[32 * ib + j] = q & 15
                codes[32 * ib + 16 + j] = q >> 4
    elif qtype == Q4_K:
        for c in range(4):
            for j in range(32):
                q = w[r, o + 16 + 32 * c + j]
                codes[64 * c + j] = q & 15
                codes[64 * c + 32 + j] = q >> 4
    elif qtype == Q5_K:
        for c in range(4):
            for j in range(32):
                q = w[r, o + 48 + 32 * c + j]
                h = w[r, o + 16 + j]
                codes[64 * c + j] = (q & 15) | (((h >> (2 * c)) & 1) << 4)
                codes[64 * c + 32 + j] = (q >> 4) | (((h >> (2 * c + 1)) & 1) << 4)
    else:  # Q6_K: ql [128], qh [64], then the scales
        for n in range(2):
            for j in range(32):
                lo, lo2, h = w[r, o + 64 * n + j], w[r, o + 64 * n + 32 + j], w[r, o + 128 + 32 * n + j]
                codes[128 * n + j] = (lo & 15) | ((h & 3) << 4)
                codes[128 * n + 32 + j] = (lo2 & 15) | (((h >> 2) & 3) << 4)
                codes[128 * n + 64 + j] = (lo >> 4) | (((h >> 4) & 3) << 4)
                codes[128 * n + 96 + j] = (lo2 >> 4) | (((h >> 6) & 3) << 4)


@kernel(inline=True)
def _pack_block(codes, c0, ln, bits, dst, at):
    """Row lane ln's 32 codes codes[c0:c0 + 32] into the block at dst[at:] (4/5/6-bit format):
    quad byte (q, ln, k) = code 4q + k | code 16 + 4q + k << 4; the fifth (sixth) bits of quad
    q's 4 codes are bits 4 ln .. 4 ln + 3 of its 64-bit mask at 256 (320) + 8q, or without
    HIGH_BITS_AS_MASKS simd_isa.high_field_ir's byte fields. 2-bit format:
    byte 64 (q // 4) + 4 ln + k holds code 4q + k in bits 2 (q % 4), 2 (q % 4) + 1."""
    if bits == 2:
        for q in range(8):
            for k in range(4):
                b = at + 64 * (q // 4) + ln * 4 + k
                dst[b] = dst[b] | np.uint8((codes[c0 + 4 * q + k] & 3) << (2 * (q % 4)))
        return
    for q in range(4):
        for k in range(4):
            dst[at + q * 64 + ln * 4 + k] = (codes[c0 + 4 * q + k] & 15) | ((codes[c0 + 16 + 4 * q + k] & 15) << 4)
    if bits > 4 and not HIGH_BITS_AS_MASKS:  # simd_isa.high_field_ir's byte fields
        for q in range(8):
            for k in range(4):
                hi = codes[c0 + 4 * q + k] >> 4
                b = at + 256 + 4 * ln + k + (64 * (q // 4) if bits == 6 else 0)
                dst[b] = dst[b] | np.uint8(hi << (2 * (q % 4)) if bits == 6 else hi << q)
        return
    shift = 4 * (ln % 2)
    for e in range(4, bits):  # bit e of the codes (4: the fifth, 5: the sixth)
        base = at + 256 + 64 * (e - 4) + ln // 2
        for q in range(8):
            nib = ((codes[c0 + 4 * q] >> e) & 1) | (((codes[c0 + 4 * q + 1] >> e) & 1) << 1) \
                | (((codes[c0 + 4 * q + 2] >> e) & 1) << 2) | (((codes[c0 + 4 * q + 3] >> e) & 1) << 3)
            dst[base + 8 * q] = dst[base + 8 * q] | np.uint8(nib << shift)


@kernel(parallel=True)
def repack_k_kernel(w, qtype, fb, bits, head, wk):
    """w uint8 [R, S * fb] (fb: the file's bytes per super-block) -> wk uint8 [G, S, B] (module
    docstring; bits and head as the type's K form); rows past R stay zero."""
    R = w.shape[0]
    S = wk.shape[1]
    blk = 64 * bits  # 16 rows x 32 columns of bits-bit codes
    for g in numba.prange(wk.shape[0]):
        codes = np.zeros(256, np.uint8)
        for ln in range(min(GROUP, R - g * GROUP)):
            r = g * GROUP + ln
            for s in range(S):
                o = s * fb
                dst = wk[g, s]
                if qtype == TQ1_0 or qtype == TQ2_0:  # d, the last two bytes
                    dst[2 * ln], dst[2 * ln + 1] = w[r, o + fb - 2], w[r, o + fb - 1]
                elif qtype == IQ4_XS:  # scale ib: low nibble of scales_l, 2 bits of scales_h
                    dst[2 * ln], dst[2 * ln + 1] = w[r, o], w[r, o + 1]
                    sh = np.int32(w[r, o + 2]) | (np.int32(w[r, o + 3]) << 8)
                    for ib in range(8):
                        ls = ((np.int32(w[r, o + 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)
                        dst[32 + 16 * ib + ln] = np.uint8((ls - 32) & 255)
                elif qtype == Q6_K:
                    dst[2 * ln], dst[2 * ln + 1] = w[r, o + 208], w[r, o + 209]
                    for j in range(16):
                        dst[32 + 16 * j + ln] = w[r, o + 192 + j]
                else:  # Q4_K, Q5_K: d, dmin, then ggml's get_scale_min_k4 of the 12 packed bytes
                    dst[2 * ln], dst[2 * ln + 1] = w[r, o], w[r, o + 1]
                    dst[32 + 2 * ln], dst[33 + 2 * ln] = w[r, o + 2], w[r, o + 3]
                    for j in range(8):
                        if j < 4:
                            sc, mn = w[r, o + 4 + j] & 63, w[r, o + 8 + j] & 63
                        else:
                            sc = (w[r, o + 8 + j] & 15) | ((w[r, o + j] >> 6) << 4)
                            mn = (w[r, o + 8 + j] >> 4) | ((w[r, o + 4 + j] >> 6) << 4)
                        dst[64 + 16 * j + ln] = sc
                        dst[192 + 16 * j + ln] = mn
                _row_codes(w, r, o, qtype, codes)
                for b in range(8):
                    _pack_block(codes, 32 * b, ln, bits, dst, head + b * blk)


def repack_k(data: np.ndarray, qtype: int, rows: int, cols: int) -> KWeights:
    """data: uint8 [rows, row_bytes] of a matrix of a type with a K-quant form, cols % 256 == 0."""
    form = k_form(qtype)
    wk = np.zeros((-(-rows // GROUP), cols // 256, form.record_bytes), np.uint8)
    file_bytes = weight_type(qtype).type_size
    if form.grid is not None:
        repack_grid_kernel(np.ascontiguousarray(data), qtype, file_bytes, form.grid.width, form.grid.index_bits,
                           form.grid.signed, form.header_bytes, form.block_bytes, wk)
    else:
        repack_k_kernel(np.ascontiguousarray(data), qtype, file_bytes, form.bits, form.header_bytes, wk)
    return KWeights(wk, qtype)
