"""llama.cpp's quantized KV types: a (token, head) row of head_dim values stored as
head_dim / 32 blocks of a legacy GGML type, byte for byte as ggml's `set_rows` writes them
(its CPU `from_float` per type), and read back by kernels_cpu.dequant's row decoders.

    q8_0    34 bytes / 32 values: d f16 (amax / 127), 32 int8 (rounded half away from zero)
    q4_0    18: d f16 (d = max / -8), 16 bytes of nibbles (value j low, j + 16 high)
    q4_1    20: d f16, m f16 (the block's min), nibbles
    q5_0    22: d f16 (max / -16), the fifth bits qh (uint32), nibbles
    q5_1    24: d f16, m f16, qh, nibbles
    iq4_nl  18: d f16, nibbles indexing the IQ4 table (ggml's row reference: no scale search)

`quantize_kv_row(code, x, dst)` is the numba form the KV store calls; its twin is
formats.quantizers (the same blocks from the reference quantizers; tests compare the bytes).

As llama.cpp does (its PR #21038), a quantized K is stored rotated: each head's vector times the
orthonormal Walsh-Hadamard matrix of the largest power of two >= 64 dividing head_dim (Q is
rotated the same way before attention, so q.k is unchanged); a quantized V in chunks of 64 (the
attention output is rotated back). The rotation spreads a head's outlier dimensions over the
block, which is what makes 4-bit keys usable on models like Qwen2.5. No rotation where head_dim
is not a multiple of 64. A pool's aux array is int64 [2]: (GGML type id, rotation size or 0).
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from edge_infer.errors import InvalidRequest
from edge_infer.formats.quant_fit_iq4 import VALUES as IQ4_VALUES
from edge_infer.formats.quant_fit_iq4 import best_index
from edge_infer.formats.weight_types import IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0

from ._jit import f32_to_f16, kernel

# the KV types by name: (GGML type id, bytes per 32 values)
KV_BLOCK_TYPES = {"q8_0": (Q8_0, 34), "q4_0": (Q4_0, 18), "q4_1": (Q4_1, 20), "q5_0": (Q5_0, 22),
                  "q5_1": (Q5_1, 24), "iq4_nl": (IQ4_NL, 18)}
_GROUP_MAX_EPS = np.float32(1e-15)  # ggml's: a block below it is all zero


FLOAT_KV_BYTES = {"f16": 2, "f32": 4}
V_ROTATION = 64  # llama.cpp rotates V in chunks of 64 ("smaller rotation matrices for V seem beneficial")


def rotation_size(head_dim: int, key: bool) -> int:
    """The Hadamard rotation a quantized K (key) or V of this head size is stored with (0: none)."""
    if head_dim % 64:
        return 0
    if not key:
        return V_ROTATION
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n  # bytes per value of the float pools


def row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one (token, head) row of K or V of any KV type."""
    if kv_type in FLOAT_KV_BYTES:
        return head_dim * FLOAT_KV_BYTES[kv_type]
    return head_dim // 32 * KV_BLOCK_TYPES[kv_type][1]


def check_kv_type(kv_type: str, head_dim: int) -> None:
    """Raise InvalidRequest unless kv_type is a KV type this backend stores for heads of head_dim."""
    if kv_type not in FLOAT_KV_BYTES and kv_type not in KV_BLOCK_TYPES:
        names = ", ".join([*FLOAT_KV_BYTES, *KV_BLOCK_TYPES])
        raise InvalidRequest(f"kv_cache_dtype {kv_type!r} is not a KV type (one of {names})")
    if kv_type in KV_BLOCK_TYPES and head_dim % 32:
        raise InvalidRequest(f"kv_cache_dtype {kv_type!r} stores blocks of 32 values, but this model's attention "
                             f"heads have {head_dim} dimensions; use f16 or f32")


@kernel(inline=True)
def _block_size_of(code):
    """Bytes per 32 values of a KV block type (kernels_cpu.kv_quant.KV_BLOCK_TYPES)."""
    if code == Q8_0:
        return 34
    if code == Q4_1:
        return 20
    if code == Q5_0:
        return 22
    if code == Q5_1:
        return 24
    return 18  # q4_0, iq4_nl


def head_dim_of(v_cache, v_aux):
    """The head size of a V pool (overloaded by pool kind)."""
    raise NotImplementedError


@overload(head_dim_of, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_head_dim_of(v_cache, v_aux):
    if isinstance(v_aux.dtype, types.Integer):
        return lambda v_cache, v_aux: v_cache.shape[3] // _block_size_of(v_aux[0]) * 32
    return lambda v_cache, v_aux: v_cache.shape[3]


@kernel(inline=True)
def _put_half(dst, o, v):
    h = f32_to_f16(v)
    dst[o] = np.uint8(h & 0xFF)
    dst[o + 1] = np.uint8(h >> 8)


@kernel(inline=True)
def _put_u32(dst, o, v):
    for k in range(4):
        dst[o + k] = np.uint8((v >> np.uint32(8 * k)) & np.uint32(0xFF))


@kernel(inline=True)
def _signed_max(x, o):
    """The value of largest magnitude among x[o:o + 32] (the first such)."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for j in range(32):
        a = abs(x[o + j])
        if amax < a:
            amax = a
            mx = x[o + j]
    return mx


@kernel(inline=True)
def _min_max(x, o):
    lo = np.float32(np.inf)
    hi = np.float32(-np.inf)
    for j in range(32):
        lo = min(lo, x[o + j])
        hi = max(hi, x[o + j])
    return lo, hi


@kernel(inline=True)
def _q8_0(x, o, dst, p):
    amax = np.float32(0.0)
    for j in range(32):
        amax = max(amax, abs(x[o + j]))
    d = amax / np.float32(127.0)
    _put_half(dst, p, d)
    inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    for j in range(32):
        v = x[o + j] * inv  # roundf: half away from zero
        r = np.int32(np.floor(abs(v) + np.float32(0.5)))
        dst[p + 2 + j] = np.uint8((-r if v < 0 else r) & 0xFF)


@kernel(inline=True)
def _nibbles(x, o, dst, p, inv, shift, top, lo):
    """Bytes p..p+15: codes min(top, trunc((x - lo) * inv + shift)) of values j and j + 16;
    returns the fifth bits (bit j of value j) for the 5-bit types."""
    qh = np.uint32(0)
    for j in range(16):
        a = min(top, np.int32((x[o + j] - lo) * inv + shift))
        b = min(top, np.int32((x[o + 16 + j] - lo) * inv + shift))
        dst[p + j] = np.uint8((a & 15) | ((b & 15) << 4))
        qh |= np.uint32((a >> 4) & 1) << np.uint32(j)
        qh |= np.uint32((b >> 4) & 1) << np.uint32(j + 16)
    return qh


@kernel(inline=True)
def _symmetric(x, o, dst, p, levels):
    """q4_0 (levels 16) and q5_0 (32): d = max / -(levels / 2), codes of x / d + levels / 2."""
    d = _signed_max(x, o) / np.float32(-(levels // 2))
    inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    _put_half(dst, p, d)
    if levels == 16:
        _nibbles(x, o, dst, p + 2, inv, np.float32(8.5), 15, np.float32(0.0))
    else:
        _put_u32(dst, p + 2, _nibbles(x, o, dst, p + 6, inv, np.float32(16.5), 31, np.float32(0.0)))


@kernel(inline=True)
def _with_min(x, o, dst, p, levels):
    """q4_1 (levels 16) and q5_1 (32): d = (max - min) / (levels - 1), codes of (x - min) / d."""
    lo, hi = _min_max(x, o)
    d = (hi - lo) / np.float32(levels - 1)
    inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    _put_half(dst, p, d)
    _put_half(dst, p + 2, lo)
    if levels == 16:
        _nibbles(x, o, dst, p + 4, inv, np.float32(0.5), 15, lo)
    else:
        _put_u32(dst, p + 4, _nibbles(x, o, dst, p + 8, inv, np.float32(0.5), 31, lo))


@kernel(inline=True)
def _iq4_nl(x, o, dst, p):
    """ggml's quantize_row_iq4_nl_ref (ntry -1: no scale search): codes of x * (-127 / max), d
    their least-squares scale under weights x^2."""
    mx = _signed_max(x, o)
    for j in range(16):
        dst[p + 2 + j] = np.uint8(0)
    if abs(mx) < _GROUP_MAX_EPS:
        _put_half(dst, p, np.float32(0.0))
        return
    inv = np.float32(1.0) / (mx / np.float32(-127.0))
    sumqx = np.float32(0.0)
    sumq2 = np.float32(0.0)
    for j in range(32):
        xv = x[o + j]
        c = best_index(inv * xv)
        q = IQ4_VALUES[c]
        wq = xv * xv * q
        sumqx += wq * xv
        sumq2 += wq * q
        if j < 16:
            dst[p + 2 + j] = np.uint8(c)
        else:
            dst[p + 2 + j - 16] |= np.uint8(c << 4)
    _put_half(dst, p, sumqx / sumq2 if sumq2 > 0 else np.float32(0.0))


@kernel(inline=True)
def hadamard_inplace(x, o, n):
    """x[o:o + n] = H_n x[o:o + n], H_n the orthonormal Walsh-Hadamard matrix (Sylvester order,
    ggml_gen_hadamard's), by the fast transform: log2 n butterfly stages, then 1 / sqrt(n)."""
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(o + i, o + i + h):
                a = x[j]
                b = x[j + h]
                x[j] = a + b
                x[j + h] = a - b
        h *= 2
    s = np.float32(1.0 / np.sqrt(np.float64(n)))
    for j in range(o, o + n):
        x[j] = x[j] * s


@kernel(parallel=True)
def hadamard_rows_kernel(x, n):
    """Each row of x (float32 [N, C], C % n == 0) rotated in place in chunks of n."""
    for t in numba.prange(x.shape[0]):
        row = x[t]
        for o in range(0, x.shape[1], n):
            hadamard_inplace(row, o, n)


@kernel(inline=True)
def store_block_row(aux, x, dst):
    """dst = x in the pool's block type aux[0], rotated first by aux[1] (> 0) as the module says."""
    if aux[1] > 0:
        r = np.empty(x.shape[0], np.float32)
        for j in range(x.shape[0]):
            r[j] = x[j]
        for o in range(0, x.shape[0], aux[1]):
            hadamard_inplace(r, o, aux[1])
        quantize_kv_row(aux[0], r, dst)
    else:
        quantize_kv_row(aux[0], x, dst)


@kernel
def quantize_kv_row(code, x, dst):
    """dst (uint8 [row_bytes]) = x (float32 [head_dim], head_dim % 32 == 0) in GGML type
    `code`'s blocks."""
    nb = x.shape[0] // 32
    for b in range(nb):
        if code == Q8_0:
            _q8_0(x, b * 32, dst, b * 34)
        elif code == Q4_0:
            _symmetric(x, b * 32, dst, b * 18, 16)
        elif code == Q5_0:
            _symmetric(x, b * 32, dst, b * 22, 32)
        elif code == IQ4_NL:
            _iq4_nl(x, b * 32, dst, b * 18)
        elif code == Q4_1:
            _with_min(x, b * 32, dst, b * 20, 16)
        else:
            _with_min(x, b * 32, dst, b * 24, 32)

