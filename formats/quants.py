"""GGML block layouts and the reference (NumPy) dequantizer and quantizer.

A quantized row of n elements is n / block_size blocks of type_size bytes each. Dequantizing
is bit-exact with gguf-py and with ggml's C code (which only differs in quieting signalling
NaNs of F16 data): each float32 comes from the same operations in the same order, e.g. Q4_K is
`(d*sc)*q - dmin*m`, never `d*(sc*q)`. Work runs in chunks of blocks so that the byte-sized
temporaries stay in cache. The quantizers live in quantizers.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType as T

from edge_infer.errors import EdgeInferError, UnsupportedTensorType
from edge_infer.formats.gguf import TensorInfo
from edge_infer.formats.kscales import k4_scale_min
from edge_infer.formats.quantizers import GRID_QUANTIZERS, QUANTIZERS
from edge_infer.formats.quantizers_weighted import WEIGHTED_QUANTIZERS, element_weights
from edge_infer.formats.quants_iq import DEQUANT_IQ
from edge_infer.formats.weight_types import QK, QK_K, TYPES, WeightType, weight_type

__all__ = [
    "BLOCK_LAYOUTS",
    "QK_K",
    "SUPPORTED_TYPES",
    "dequantize",
    "dequantize_blocks",
    "quantize",
]

# Each type's sizes and block dtype (byte layouts drawn in weight_types.py), keyed by gguf's enum.
BLOCK_LAYOUTS: dict[T, WeightType] = {T(t.id): t for t in TYPES}
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


# the quantized types of weight_types.TYPES (tests/formats/test_weight_types.py checks the keys)
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
    **{T(k): fn for k, fn in DEQUANT_IQ.items()},
}


def dequantize_blocks(data: np.ndarray, qtype: T | int, n_elements: int) -> np.ndarray:
    """Raw GGML bytes (uint8, n_elements / block_size * type_size of them) -> float32 (n_elements,).

    For F32 the result is a view of `data` (read-only when `data` maps a file); otherwise a new array.
    """
    lay = weight_type(qtype, "dequantize")
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
    weight_type(t.type, f"tensor {t.name!r}")
    return dequantize_blocks(t.data, t.type, t.n_elements).reshape(t.numpy_shape)


def quantize(x: np.ndarray, qtype: T | int, importance: np.ndarray | None = None) -> np.ndarray:
    """float32 (..., n), n a multiple of the block size -> uint8 (..., n / block_size * type_size).

    For finite input, bit-exact with gguf-py where it has a quantizer (F32, F16, BF16, Q4_0,
    Q4_1, Q5_0, Q5_1, Q8_0) and with ggml's `quantize_row_*_ref` (no importance matrix) for
    every type, but for the sign of d in an all-zero Q4_0/Q5_0 block led by -0.0 (gguf-py's).

    importance: float (n,), each input channel's mean squared activation: the block scales are
    then fitted to the importance-weighted error (quantizers_weighted.py) for the types that
    have a weighted form; the others ignore it.
    """
    lay = weight_type(qtype, "quantize")
    if not lay.quantizer:
        raise UnsupportedTensorType(
            f"quantize to {lay.name}: edge-infer reads and computes {lay.name} but does not write it yet; "
            f"llama.cpp's llama-quantize does")
    if T(lay.id) in GRID_QUANTIZERS:
        return _quantize_grid(x, lay, importance)
    if importance is not None and lay.weighted:
        return _quantize_weighted(x, lay, importance)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % lay.block_size:
        raise EdgeInferError(
            f"quantize to {lay.name}: row length {x.shape[-1] if x.ndim else 0} "
            f"is not a multiple of the block size {lay.block_size}"
        )
    fn = QUANTIZERS[T(lay.id)]
    rows = x.reshape(-1, lay.block_size)
    out = np.empty((len(rows), lay.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // lay.block_size)
    # All-zero blocks divide by zero in lanes whose results are then discarded, as in C.
    with np.errstate(all="ignore"):
        for s in range(0, len(rows), step):
            out[s : s + step] = fn(rows[s : s + step]).reshape(-1, lay.type_size)
    return out.reshape(*x.shape[:-1], x.shape[-1] // lay.block_size * lay.type_size)


def _rows_and_importance(x: np.ndarray, lay: WeightType, importance: np.ndarray | None
                         ) -> tuple[np.ndarray, np.ndarray | None]:
    """x as float32 rows (m, n) and the importance as float32 (n,), both checked."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or n % lay.block_size:
        raise EdgeInferError(f"quantize to {lay.name}: row length {n} is not a multiple of the block size {lay.block_size}")
    if importance is None:
        return x.reshape(-1, n), None
    imp = np.asarray(importance, dtype=np.float32).reshape(-1)
    if imp.shape != (n,) or not np.isfinite(imp).all() or (imp < 0).any():
        raise EdgeInferError(f"quantize to {lay.name}: the importance must be {n} finite non-negative values, "
                             f"got {imp.shape[0]}")
    return x.reshape(-1, n), imp


def _quantize_grid(x: np.ndarray, lay: WeightType, importance: np.ndarray | None) -> np.ndarray:
    """The grid types (IQ2, IQ3, IQ1): ggml's search under the importance as it is (no floor
    for unused channels), so the bytes are llama-quantize's."""
    rows, imp = _rows_and_importance(x, lay, importance)
    n = rows.shape[1]
    out = np.empty((len(rows), n // 256 * lay.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMENTS * 4 // n)
    fn = GRID_QUANTIZERS[T(lay.id)]
    with np.errstate(over="ignore"):  # a d beyond f16's range becomes inf, as in C
        for s in range(0, len(rows), step):
            r = rows[s : s + step]
            w = None if imp is None else np.broadcast_to(imp, r.shape).reshape(-1, 256)
            out[s : s + step] = fn(r.reshape(-1, 256), importance=w).reshape(len(r), -1)
    return out.reshape(*x.shape[:-1], out.shape[1])


def _quantize_weighted(x: np.ndarray, lay: WeightType, importance: np.ndarray) -> np.ndarray:
    rows, imp = _rows_and_importance(x, lay, importance)
    assert imp is not None
    n = rows.shape[1]
    imp = imp + np.float32(1e-12) * max(float(imp.max()), 1e-30)  # a never-active channel still counts a little
    fn, per_row = WEIGHTED_QUANTIZERS[T(lay.id)], n // lay.block_size
    out = np.empty((len(rows), per_row * lay.type_size), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // n)
    with np.errstate(all="ignore"):
        for s in range(0, len(rows), step):
            r = rows[s : s + step]
            w = element_weights(r, imp)
            out[s : s + step] = fn(r.reshape(-1, lay.block_size), w.reshape(-1, lay.block_size)).reshape(len(r), -1)
    return out.reshape(*x.shape[:-1], per_row * lay.type_size)
