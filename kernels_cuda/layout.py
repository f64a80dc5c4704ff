"""Host-side repacking of GGUF matrices into the CUDA kernels' form, done once at load.

Each type's form is its record's `cuda` in formats.weight_types.
"codes" form, for every type whose weights are integer codes times a scale plus an offset per
16 or 32 columns (the legacy types, Q4_K, Q5_K, Q6_K): signed codes int8 [R, K] (rows
contiguous, so a warp's int32 loads coalesce), and per 16 columns a scale and an offset float32
[R, K/16]: weight = s * code + o, exactly as kernels_cpu.reference decodes them.
"nibbles" form for the 4-bit types (Q4_0, Q4_1, Q4_K): the same codes plus `off` (the record's
nibble_offset: 8 for Q4_0, else 0), 0..15, two per byte, uint8 [R, K/2]: byte j of int32 word i
holds column 8i + j in its low nibble and 8i + 4 + j in its high one (so a word's masked low and
high halves are two dp4a words of four consecutive columns); s and o as the codes form: weight
= s * (u - off) + o.
"float" form for the rest: F16 rows as float16, everything else decoded to float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.formats.quants import dequantize_blocks
from edge_infer.formats.weight_types import F16, TYPES, weight_type
from edge_infer.kernels_cpu.reference import i8_codes, k_codes

# the types of the codes form, and the nibble offset of those packed as nibbles (u = code + off is 0..15)
CODE_TYPES = tuple(t.id for t in TYPES if t.cuda.kind in ("codes", "nibbles"))
NIBBLE_OFFSET = {t.id: t.cuda.nibble_offset for t in TYPES if t.cuda.kind == "nibbles"}
_ROWS_PER_CHUNK = 256  # rows decoded at a time (the integer views are int64: keep them small)


@dataclass(slots=True)
class HostMatrix:
    """A matrix in the CUDA kernels' form, still on the host. kind "codes": q int8 [R, K],
    s, o float32 [R, K/16]; kind "nibbles": q uint8 [R, K/2], s, o, off; kind "float": f
    float16 or float32 [R, K]."""

    kind: str
    rows: int
    cols: int
    q: np.ndarray | None = None
    s: np.ndarray | None = None
    o: np.ndarray | None = None
    f: np.ndarray | None = None
    off: int = 0


def pack_nibbles(codes: np.ndarray, off: int) -> np.ndarray:
    """Signed codes int8 [R, K] (K % 8 == 0, codes + off in 0..15) -> uint8 [R, K/2] nibbles."""
    r, k = codes.shape
    u: np.ndarray = codes.astype(np.int16) + off
    if u.size and (u.min() < 0 or u.max() > 15):
        raise ValueError(f"codes + {off} leave 0..15: not a 4-bit matrix")
    u = u.astype(np.uint8).reshape(r, k // 8, 2, 4)  # [row, word, low/high half, byte]
    return (u[:, :, 0, :] | (u[:, :, 1, :] << 4)).reshape(r, k // 2)


def unpack_nibbles(q: np.ndarray, off: int) -> np.ndarray:
    """pack_nibbles' inverse: uint8 [R, K/2] -> signed codes int8 [R, K]."""
    r = q.shape[0]
    b = q.reshape(r, -1, 1, 4)
    u = np.concatenate([b & 15, b >> 4], axis=2)  # [row, word, half, byte]
    return (u.reshape(r, -1).astype(np.int16) - off).astype(np.int8)


def _codes_chunk(w: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF rows uint8 [r, row_bytes] -> (codes int8 [r, K], s, o float32 [r, K/16])."""
    r = w.shape[0]
    form = weight_type(qtype).k
    if form is not None:
        codes, sc, mn, d, dmin = k_codes(w, qtype)
        if form.table is not None:  # IQ4_XS: the table's values, a scale per 32
            s32 = (sc.astype(np.float32) * d[:, :, None]).reshape(r, -1)  # (d * sc), as the CPU kernel
            return (codes - 128).astype(np.int8), np.repeat(s32, 2, axis=1), np.zeros((r, s32.shape[1] * 2), np.float32)
        if mn is None:  # Q6_K: weight = d * sc * (code - 32), a scale per 16
            s = (sc.astype(np.float32) * d[:, :, None]).reshape(r, -1)
            return (codes - 32).astype(np.int8), s, np.zeros_like(s)
        assert dmin is not None
        s32 = (sc.astype(np.float32) * d[:, :, None]).reshape(r, -1)  # (d * sc), as the CPU kernel
        o32 = (mn.astype(np.float32) * -dmin[:, :, None]).reshape(r, -1)
        return codes.astype(np.int8), np.repeat(s32, 2, axis=1), np.repeat(o32, 2, axis=1)
    codes, d, m, offset = i8_codes(w, qtype)
    s = np.repeat(d, 2, axis=1)
    o = np.repeat(m, 2, axis=1) if m is not None else np.zeros_like(s)
    return (codes.reshape(r, -1) - offset).astype(np.int8), s, o


def to_host_matrix(data: np.ndarray, qtype: int, rows: int, cols: int, nibbles: bool = True) -> HostMatrix:
    """GGUF rows uint8 [rows, row_bytes] of a `qtype` matrix -> its CUDA form (cols % 32 == 0
    for the codes form, % 256 for the K-quants; other shapes take the float form); the 4-bit
    types are packed as nibbles unless `nibbles` is False."""
    data = data.reshape(rows, -1)
    if qtype in CODE_TYPES and cols % weight_type(qtype).block_size == 0:
        q = np.empty((rows, cols), np.int8)
        s = np.empty((rows, cols // 16), np.float32)
        o = np.empty((rows, cols // 16), np.float32)
        for at in range(0, rows, _ROWS_PER_CHUNK):
            end = min(rows, at + _ROWS_PER_CHUNK)
            q[at:end], s[at:end], o[at:end] = _codes_chunk(data[at:end], qtype)
        if nibbles and qtype in NIBBLE_OFFSET:
            off = NIBBLE_OFFSET[qtype]
            return HostMatrix("nibbles", rows, cols, q=pack_nibbles(q, off), s=s, o=o, off=off)
        return HostMatrix("codes", rows, cols, q=q, s=s, o=o)
    if qtype == F16:
        return HostMatrix("float", rows, cols, f=np.ascontiguousarray(data).view(np.float16).reshape(rows, cols))
    f = np.empty((rows, cols), np.float32)
    for at in range(0, rows, _ROWS_PER_CHUNK):
        end = min(rows, at + _ROWS_PER_CHUNK)
        f[at:end] = dequantize_blocks(data[at:end], qtype, (end - at) * cols).reshape(end - at, cols)
    return HostMatrix("float", rows, cols, f=f)


def decode(m: HostMatrix) -> np.ndarray:
    """The float32 weights of a HostMatrix (the tests' check that the form loses nothing)."""
    if m.kind == "float":
        assert m.f is not None
        return m.f.astype(np.float32)
    assert m.q is not None and m.s is not None and m.o is not None
    codes = unpack_nibbles(m.q, m.off) if m.kind == "nibbles" else m.q
    q = codes.reshape(m.rows, -1, 16).astype(np.float32)
    return (q * m.s[:, :, None] + m.o[:, :, None]).reshape(m.rows, m.cols)
