"""One-time repacking of GGUF weight rows into the int8 kernel's row-interleaved layout (drawn
in kernels_cpu.matmul_i8), for the types with an int8 form in formats.weight_types: Q8_0 ->
8-bit format, Q4_0 / Q4_1 -> 4-bit, Q5_0 / Q5_1 -> 5-bit, IQ4_NL and MXFP4 -> their table
formats (the 4-bit format's bytes, read through the type's 16 values: simd_dot.TABLES).

The repacked copy replaces the mmap'd pages of the tensor (the caller drops them), so memory
stays at the file size: bytes per weight 1.0625 for Q8_0, 0.5625 / 0.625 for Q4_0 / Q4_1,
0.6875 / 0.75 for Q5_0 / Q5_1, 0.5625 for IQ4_NL and MXFP4 (whose one-byte E8M0 scale 2^(e - 128)
becomes the f16 of the same value: exact for e in 104..143, gpt-oss's range; a matrix with a
scale outside it stays on the float path). Weight values are carried over exactly: quant codes as they
are, scales and mins as their f16 bits (the kernel converts 16 at once, exactly; storing them
as float32 cost the 4-bit GEMV a sixth more bytes to stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from edge_infer.formats.weight_types import MXFP4, TYPES, I8Form, weight_type

from ._jit import kernel, u16_at
from .simd_dot import TABLE_OFFSET, table_format
from .simd_i8 import GROUP
from .simd_isa import HIGH_BITS_AS_MASKS, SIGNED_EIGHT


def zero_code(form: I8Form) -> int:
    """The u8 code of a zero weight the dot products see: the form's, or for signed codes
    (stored as q + 128) 128, except with SIGNED_EIGHT (sdot, AVX2), whose dot products read
    q + 128 as the signed q (their sums need no offset correction); a table's values are
    signed codes too."""
    if form.table is not None:
        return TABLE_OFFSET
    if form.zero is None:
        return 0 if SIGNED_EIGHT else 128
    return form.zero


# qtype -> (bytes per 32-block in the repacked layout, u8 value of a zero weight offset), from
# formats.weight_types' int8 forms
I8_FORMATS = {t.id: (t.i8.block_bytes, zero_code(t.i8)) for t in TYPES if t.i8 is not None}
WITH_MIN = tuple(t.id for t in TYPES if t.i8 is not None and t.i8.has_min)


@dataclass(frozen=True, slots=True)
class I8Weights:
    """A matrix in matmul_i8's layout: wi uint8 [G, nb, 512 | 256 | 320], wd uint16 [G, nb, 16]
    scales (f16 bits), wm uint16 [G, nb, 16] mins (Q4_1, Q5_1) or [0, 0, 0], offset the u8
    code of zero, fmt the dot product's format (8, 4, 5 or a table format; simd_i8)."""

    wi: np.ndarray
    wd: np.ndarray
    wm: np.ndarray
    offset: int
    fmt: int

    @property
    def nbytes(self) -> int:
        """Bytes a product with this matrix reads."""
        return self.wi.nbytes + self.wd.nbytes + self.wm.nbytes

    @property
    def args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """The matrix's arguments to matmul_i8's kernels: (wi, wd, wm, w_offset, fmt)."""
        return self.wi, self.wd, self.wm, self.offset, self.fmt


@kernel(parallel=True)
def repack_q8_0(w, wi, wd):
    """Q8_0 rows (uint8 [R, nb * 34]) -> interleaved u8 = q + 128 (wi [G, nb, 512]) and the
    scales' f16 bits (wd [G, nb, 16]); rows past R stay zero."""
    R = w.shape[0]
    nb = w.shape[1] // 34
    for g in numba.prange(wi.shape[0]):
        for ln in range(min(GROUP, R - g * GROUP)):
            r = g * GROUP + ln
            for b in range(nb):
                o = b * 34
                wd[g, b, ln] = u16_at(w, r, o)
                for j in range(32):
                    q, k = j // 4, j % 4
                    wi[g, b, q * 64 + ln * 4 + k] = np.uint8((np.int32(np.int8(w[r, o + 2 + j])) + 128) & 255)


@kernel(parallel=True)
def repack_nibbles(w, has_min, fifth, wi, wd, wm):
    """Q4_0 / Q4_1 (fifth False) or Q5_0 / Q5_1 (fifth True) rows -> 4- or 5-bit format.
    Blocks: d, [m if has_min], [qh: 32 fifth bits if fifth], 16 code bytes. Code byte j holds
    column j in its low and j + 16 in its high nibble, which is what the layout wants of quad
    byte (q, l, k) for j = 4q + k: the bytes move, the nibbles stay. The 5-bit format adds, per
    quad q, a 64-bit mask at bytes 256 + 8q whose bit 4l + k is the fifth bit of row l's column
    4q + k (without mask registers, simd_isa.HIGH_BITS_AS_MASKS: bit q of byte 256 + 4l + k). wd [G, nb, 16] = d, wm [G, nb, 16] = m (with mins only), as f16 bits; rows past R stay zero."""
    R = w.shape[0]
    head = 4 if has_min else 2
    codes = head + (4 if fifth else 0)
    bsz = codes + 16
    nb = w.shape[1] // bsz
    for g in numba.prange(wi.shape[0]):
        for ln in range(min(GROUP, R - g * GROUP)):
            r = g * GROUP + ln
            for b in range(nb):
                o = b * bsz
                wd[g, b, ln] = u16_at(w, r, o)
                if has_min:
                    wm[g, b, ln] = u16_at(w, r, o + 2)
                for j in range(16):
                    wi[g, b, (j // 4) * 64 + ln * 4 + j % 4] = w[r, o + codes + j]
                if fifth:
                    for c in range(32):
                        if (w[r, o + head + c // 8] >> (c % 8)) & 1:
                            if HIGH_BITS_AS_MASKS:
                                bit = 4 * ln + c % 4
                                at, v = 256 + 8 * (c // 4) + bit // 8, 1 << (bit % 8)
                            else:  # simd_isa.high_field_ir's: bit q of byte 256 + 4l + k
                                at, v = 256 + 4 * ln + c % 4, 1 << (c // 4)
                            wi[g, b, at] = wi[g, b, at] | np.uint8(v)


# MXFP4's E8M0 bytes whose scale 2^(e - 128) an f16 holds exactly (2^-24, a subnormal, .. 2^15)
E8M0_IN_F16 = (104, 143)


@kernel(parallel=True)
def repack_mxfp4(w, wi, wd):
    """MXFP4 rows (uint8 [R, nb * 17]: e, then 16 code bytes as Q4_0's) -> the 4-bit format (wi
    [G, nb, 256]) and wd [G, nb, 16] = the f16 bits of 2^(e - 128) (e within E8M0_IN_F16)."""
    R = w.shape[0]
    nb = w.shape[1] // 17
    for g in numba.prange(wi.shape[0]):
        for ln in range(min(GROUP, R - g * GROUP)):
            r = g * GROUP + ln
            for b in range(nb):
                o = b * 17
                k = np.int32(w[r, o]) - 128
                wd[g, b, ln] = np.uint16((k + 15) << 10) if k >= -14 else np.uint16(1 << (k + 24))
                for j in range(16):
                    wi[g, b, (j // 4) * 64 + ln * 4 + j % 4] = w[r, o + 1 + j]


def repack(data: np.ndarray, qtype: int, rows: int, cols: int) -> I8Weights | None:
    """data: uint8 [rows, row_bytes] of a matrix of a type with an int8 form, cols % 32 == 0;
    None for an MXFP4 matrix with a scale an f16 cannot hold (the float path computes it)."""
    form = weight_type(qtype).i8
    if form is None:
        raise ValueError(f"repack: {weight_type(qtype).name} has no int8 form")
    groups, nb = -(-rows // GROUP), cols // 32
    wi = np.zeros((groups, nb, form.block_bytes), np.uint8)
    wd = np.zeros((groups, nb, GROUP), np.uint16)
    wm = np.zeros((groups, nb, GROUP) if form.has_min else (0, 0, 0), np.uint16)
    if qtype == MXFP4:
        e = data.reshape(rows, -1, 17)[:, :, 0]
        if e.size and (e.min() < E8M0_IN_F16[0] or e.max() > E8M0_IN_F16[1]):
            return None
        repack_mxfp4(data, wi, wd)
        bits = 4
    elif form.zero is None and form.table is None:  # signed 8-bit codes
        repack_q8_0(data, wi, wd)
        bits = 8
    else:  # nibbles (the table formats' too: IQ4_NL's blocks are Q4_0's)
        repack_nibbles(data, form.has_min, form.fifth_bit, wi, wd, wm)
        bits = 5 if form.fifth_bit else 4
    return I8Weights(wi, wd, wm, zero_code(form), table_format(bits, form.table))
