"""GGML block layouts and the reference (NumPy) dequantizer and quantizer.

A quantized row of n elements is n / block_size blocks of type_size bytes each. Dequantizing
is bit-exact with gguf-py and with ggml's C code (which only differs in quieting signalling
NaNs of F16 data): each float32 comes from the same operations in the same order, e.g. Q4_K is
`(d*sc)*q - dmin*m`, never `d*(sc*q)`. Work runs in chunks of blocks so that the byte-sized
temporaries stay in cache. The quantizers live in quantizers.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from edge_infer.errors import EdgeInferError, UnsupportedTensorType
from edge_infer.formats.gguf import TensorInfo
from edge_infer.formats.kscales import k4_scale_min
from edge_infer.formats.quantizers import QUANTIZERS
from edge_infer.formats.quantizers_weighted import WEIGHTED_QUANTIZERS, element_weights

__all__ = [
    "BLOCK_LAYOUTS",
    "QK_K",
    "SUPPORTED_TYPES",
    "BlockLayout",
    "dequantize",
    "dequantize_blocks",
    "quantize",
]

QK = 32  # elements per block of the "legacy" types
QK_K = 256  # elements per super-block of the K-quants


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """One type's block: `block_size` elements stored in `type_size` bytes; `dtype` is a
    NumPy structured dtype of one block (itemsize == type_size) with its fields named."""

    name: str
    block_size: int
    type_size: int
    dtype: np.dtype


def _blk(*fields: tuple) -> np.dtype:
    return np.dtype(list(fields))


# Byte layouts, in storage order; f16/f32 little-endian. "lo"/"hi" = low/high nibble.
BLOCK_LAYOUTS: dict[T, BlockLayout] = {
    T.F32: BlockLayout("F32", 1, 4, np.dtype("<f4")),
    T.F16: BlockLayout("F16", 1, 2, np.dtype("<f2")),
    # the top 16 bits of an f32
    T.BF16: BlockLayout("BF16", 1, 2, np.dtype("<u2")),
    # d: f16 | qs: 16 x u8 (lo = element j, hi = element j+16); x = d * (q - 8)
    T.Q4_0: BlockLayout("Q4_0", QK, 18, _blk(("d", "<f2"), ("qs", "u1", 16))),
    # d: f16 | m: f16 | qs: 16 x u8 (as Q4_0); x = d*q + m
    T.Q4_1: BlockLayout("Q4_1", QK, 20, _blk(("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16))),
    # d: f16 | qh: u32 (bit j = bit 4 of element j) | qs: 16 x u8 (as Q4_0); x = d * (q - 16)
    T.Q5_0: BlockLayout("Q5_0", QK, 22, _blk(("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16))),
    # d: f16 | m: f16 | qh: u32 | qs: 16 x u8 (as Q5_0); x = d*q + m
    T.Q5_1: BlockLayout("Q5_1", QK, 24, _blk(("d", "<f2"), ("m", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16))),
    # d: f16 | qs: 32 x i8; x = q * d
    T.Q8_0: BlockLayout("Q8_0", QK, 34, _blk(("d", "<f2"), ("qs", "i1", 32))),
    # scales: 16 x u8 (lo = scale, hi = min of sub-block s, 16 elements each) |
    # qs: 64 x u8 (element 128h + 32j + l = bits 2j..2j+1 of qs[32h + l]) | d: f16 | dmin: f16
    # x = (d*sc)*q - dmin*m
    T.Q2_K: BlockLayout(
        "Q2_K", QK_K, 84, _blk(("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2"))
    ),
    # hmask: 32 x u8 (element 128h + 32j + l: bit 4h+j of hmask[l]) | qs: 64 x u8 (2 low bits, as Q2_K) |
    # scales: 12 x u8 (16 6-bit scales: low 4 bits in bytes 0-7 lo then hi, high 2 bits in bytes 8-11) |
    # d: f16; x = (d * (sc - 32)) * (q - (hmask bit ? 0 : 4))
    T.Q3_K: BlockLayout(
        "Q3_K", QK_K, 110, _blk(("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2"))
    ),
    # d: f16 | dmin: f16 | scales: 12 x u8 (8 6-bit scales + 8 6-bit mins, see k4_scale_min) |
    # qs: 128 x u8 (element 64p + l = lo of qs[32p + l], 64p + 32 + l = hi); x = (d*sc)*q - dmin*m
    T.Q4_K: BlockLayout(
        "Q4_K", QK_K, 144, _blk(("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128))
    ),
    # d: f16 | dmin: f16 | scales: 12 x u8 (as Q4_K) | qh: 32 x u8 (element 32s + l: bit s of qh[l]) |
    # qs: 128 x u8 (4 low bits, as Q4_K); x = (d*sc)*q - dmin*m
    T.Q5_K: BlockLayout(
        "Q5_K",
        QK_K,
        176,
        _blk(("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)),
    ),
    # ql: 128 x u8 (element 128h + 32k + l: lo (k<2) or hi (k>=2) of ql[64h + 32(k%2) + l]) |
    # qh: 64 x u8 (bits 2k..2k+1 of qh[32h + l]) | scales: 16 x i8 (one per 16 elements) | d: f16
    # x = (d*sc) * (q - 32)
    T.Q6_K: BlockLayout(
        "Q6_K", QK_K, 210, _blk(("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2"))
    ),
    # d: f32 | qs: 256 x i8 | bsums: 16 x i16 (sum of each 16 quants, for dot products); x = d * q
    T.Q8_K: BlockLayout("Q8_K", QK_K, 292, _blk(("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16))),
}
SUPPORTED_TYPES: frozenset[T] = frozenset(BLOCK_LAYOUTS)

# Blocks per chunk: ~64 Ki elements, so a chunk's temporaries fit in L2.
_CHUNK_ELEMENTS = 1 << 16


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) u8 -> (n, 2, k) u8: low nibbles, then high nibbles."""
    qs = np.ascontiguousarray(qs)  # one gather, then the two passes run as flat loops
    out = np.empty((qs.shape[0], 2, qs.shape[1]), np.uint8)
    np.bitwise_and(qs, 0x0F, out=out[:, 0])
    np.right_shift(qs, 4, out=out[:, 1])
    return out


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """(n, k) u8 -> (n, 4, k) u8: bit pairs 0-1, 2-3, 4-5, 6-7."""
    return (qs[:, None, :] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & np.uint8(3)


def _bits(qh: np.ndarray) -> np.ndarray:
    """(n, k) u8 -> (n, 8, k) u8: bit s of byte l at [s, l]."""
    return np.unpackbits(qh[:, :, None], axis=2, bitorder="little").transpose(0, 2, 1)


# -- dequantizers: structured blocks (n,) -> out (n, block_size) float32 ---------------------
def _dq_q4_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _nibbles(b["qs"]).reshape(len(b), QK).view(np.int8)
    q -= 8
    np.multiply(_f32(b["d"])[:, None], q, out=out)


def _dq_q4_1(b: np.ndarray, out: np.ndarray) -> None:
    # two passes, two roundings: ggml's `x*d + m` is compiled without FMA
    np.multiply(_f32(b["d"])[:, None], _nibbles(b["qs"]).reshape(len(b), QK), out=out)
    out += _f32(b["m"])[:, None]


def _q5(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b["qs"]).reshape(len(b), QK)
    q |= np.unpackbits(b["qh"], axis=1, bitorder="little") << 4
    return q


def _dq_q5_0(b: np.ndarray, out: np.ndarray) -> None:
    q = _q5(b).view(np.int8)
    q -= 16
    np.multiply(_f32(b["d"])[:, None], q, out=out)


def _dq_q5_1(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_f32(b["d"])[:, None], _q5(b), out=out)
    out += _f32(b["m"])[:, None]


def _dq_q8_0(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(b["qs"], _f32(b["d"])[:, None], out=out)


def _dq_q2_k(b: np.ndarray, out: np.ndarray) -> None:
    n, sc = len(b), b["scales"]
    dl = _f32(b["d"])[:, None] * _f32(sc & 0x0F)  # (n, 16), rounded once like the C code
    ml = _f32(b["dmin"])[:, None] * _f32(sc >> 4)
    q = _crumbs(b["qs"].reshape(n * 2, 32)).reshape(n, 16, 16)  # [h, j, l] -> element order
    o = out.reshape(n, 16, 16)
    np.multiply(dl[:, :, None], q, out=o)
    o -= ml[:, :, None]


def _dq_q3_k(b: np.ndarray, out: np.ndarray) -> None:
    n, s = len(b), b["scales"]
    lo = _nibbles(s[:, :8]).reshape(n, 16)
    hi = _crumbs(s[:, 8:12]).reshape(n, 16)
    sc = (lo | (hi << 4)).view(np.int8) - np.int8(32)
    dl = _f32(b["d"])[:, None] * _f32(sc)
    q = _crumbs(b["qs"].reshape(n * 2, 32)).reshape(n, 8, 32).view(np.int8)
    q -= (_bits(b["hmask"]) ^ np.uint8(1)).view(np.int8) << 2  # a set hmask bit means "no -4"
    np.multiply(dl.reshape(n, 16, 1), q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _dq_q4_k(b: np.ndarray, out: np.ndarray, q: np.ndarray | None = None) -> None:
    n = len(b)
    sc, mn = k4_scale_min(b["scales"])
    dl = _f32(b["d"])[:, None] * _f32(sc)
    ml = _f32(b["dmin"])[:, None] * _f32(mn)
    if q is None:
        q = _nibbles(b["qs"].reshape(n * 4, 32)).reshape(n, 8, 32)
    o = out.reshape(n, 8, 32)
    np.multiply(dl[:, :, None], q, out=o)
    o -= ml[:, :, None]


def _dq_q5_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    q = _nibbles(b["qs"].reshape(n * 4, 32)).reshape(n, 8, 32)
    q |= _bits(b["qh"]) << 4
    _dq_q4_k(b, out, q)


def _dq_q6_k(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    q = _nibbles(b["ql"].reshape(n * 2, 64)).reshape(n, 2, 2, 2, 32)  # [h, nibble, half, l]
    q = q.reshape(n, 2, 4, 32)  # k = 2*nibble + half, as the layout wants
    q |= _crumbs(b["qh"].reshape(n * 2, 32)).reshape(n, 2, 4, 32) << 4
    q = q.view(np.int8)
    q -= 32
    dl = _f32(b["d"])[:, None] * _f32(b["scales"])
    np.multiply(dl.reshape(n, 16, 1), q.reshape(n, 16, 16), out=out.reshape(n, 16, 16))


def _dq_q8_k(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(b["d"][:, None], b["qs"], out=out)


_DEQUANT: dict[T, Callable[[np.ndarray, np.ndarray], None]] = {
    T.Q4_0: _dq_q4_0,
    T.Q4_1: _dq_q4_1,
    T.Q5_0: _dq_q5_0,
    T.Q5_1: _dq_q5_1,
    T.Q8_0: _dq_q8_0,
    T.Q2_K: _dq_q2_k,
    T.Q3_K: _dq_q3_k,
    T.Q4_K: _dq_q4_k,
    T.Q5_K: _dq_q5_k,
    T.Q6_K: _dq_q6_k,
    T.Q8_K: _dq_q8_k,
}


def _type_name(qtype: T | int) -> str:
    return T(qtype).name if qtype in T._value2member_map_ else f"{qtype} (unknown)"


def _layout(qtype: T | int, what: str) -> BlockLayout:
    lay = BLOCK_LAYOUTS.get(qtype)  # type: ignore[call-overload]
    if lay is None:
        supported = ", ".join(lay.name for lay in BLOCK_LAYOUTS.values())
        raise UnsupportedTensorType(
            f"{what}: type {_type_name(qtype)} is not supported (supported: {supported})"
        )
    return lay


def dequantize_blocks(data: np.ndarray, qtype: T, n_elements: int) -> np.ndarray:
    """Raw GGML bytes (uint8, n_elements / block_size * type_size of them) -> float32 (n_elements,).

    For F32 the result is a view of `data` (read-only when `data` maps a file); otherwise a new array.
    """
    lay = _layout(qtype, "dequantize")
    if n_elements < 0 or n_elements % lay.block_size:
        raise EdgeInferError(
            f"dequantize {lay.name}: {n_elements} elements is not a whole number of "
            f"{lay.block_size}-element blocks"
        )
    nbytes = n_elements // lay.block_size * lay.type_size
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if data.size != nbytes:
        raise EdgeInferError(
            f"dequantize {lay.name}: {n_elements} elements need {nbytes} bytes, got {data.size}"
        )
    qtype = T(qtype)
    if qtype == T.F32:
        return data.view(np.float32)
    if qtype == T.F16:
        return data.view(np.float16).astype(np.float32)
    if qtype == T.BF16:
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    blocks = data.view(lay.dtype)
    out = np.empty((len(blocks), lay.block_size), np.float32)
    fn, step = _DEQUANT[qtype], max(1, _CHUNK_ELEMENTS // lay.block_size)
    with np.errstate(invalid="ignore", over="ignore"):  # inf/NaN scales decode to inf/NaN, as in C
        for s in range(0, len(blocks), step):
            fn(blocks[s : s + step], out[s : s + step])
    return out.reshape(-1)


def dequantize(t: TensorInfo) -> np.ndarray:
    """A GGUF tensor -> float32 array of numpy shape reversed(t.shape) (ne[0] is the last axis)."""
    _layout(t.type, f"tensor {t.name!r}")
    return dequantize_blocks(t.data, t.type, t.n_elements).reshape(t.numpy_shape)


def quantize(x: np.ndarray, qtype: T, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 (..., n), n a multiple of the block size -> uint8 (..., n / block_size * type_size).

    For finite input, bit-exact with gguf-py where it has a quantizer (F32, F16, BF16, Q4_0,
    Q4_1, Q5_0, Q5_1, Q8_0) and with ggml's `quantize_row_*_ref` (no importance matrix) for
    every type, but for the sign of d in an all-zero Q4_0/Q5_0 block led by -0.0 (gguf-py's).

    importance: float (n,), each input channel's mean squared activation: the block scales are
    then fitted to the importance-weighted error (quantizers_weighted.py) for the types that
    have a weighted form; the others ignore it.
    """
    if importance is not None and T(qtype) in WEIGHTED_QUANTIZERS:
        return _quantize_weighted(x, T(qtype), importance)
    lay = _layout(qtype, "quantize")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % lay.block_size:
        raise EdgeInferError(
            f"quantize to {lay.name}: row length {x.shape[-1] if x.ndim else 0} "
            f"is not a multiple of the block size {lay.block_size}"
        )
    fn = QUANTIZERS[T(qtype)]
    rows = x.reshape(-1, lay.block_size)
    out = np.empty((len(rows), lay.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // lay.block_size)
    # All-zero blocks divide by zero in lanes whose results are then discarded, as in C.
    with np.errstate(all="ignore"):
        for s in range(0, len(rows), step):
            out[s : s + step] = fn(rows[s : s + step]).reshape(-1, lay.type_size)
    return out.reshape(*x.shape[:-1], x.shape[-1] // lay.block_size * lay.type_size)


def _quantize_weighted(x: np.ndarray, qtype: T, importance: np.ndarray) -> np.ndarray:
    lay = _layout(qtype, "quantize")
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or n % lay.block_size:
        raise EdgeInferError(f"quantize to {lay.name}: row length {n} is not a multiple of the block size {lay.block_size}")
    imp = np.asarray(importance, dtype=np.float32).reshape(-1)
    if imp.shape != (n,) or not np.isfinite(imp).all() or (imp < 0).any():
        raise EdgeInferError(f"quantize to {lay.name}: the importance must be {n} finite non-negative values, "
                             f"got {imp.shape[0]}")
    imp = imp + np.float32(1e-12) * max(float(imp.max()), 1e-30)  # a never-active channel still counts a little
    rows = x.reshape(-1, n)
    fn, per_row = WEIGHTED_QUANTIZERS[qtype], n // lay.block_size
    out = np.empty((len(rows), per_row * lay.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // n)
    with np.errstate(all="ignore"):
        for s in range(0, len(rows), step):
            r = rows[s : s + step]
            w = element_weights(r, imp)
            out[s : s + step] = fn(r.reshape(-1, lay.block_size), w.reshape(-1, lay.block_size)).reshape(len(r), -1)
    return out.reshape(*x.shape[:-1], per_row * lay.type_size)
