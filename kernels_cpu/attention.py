"""Paged attention over a block-table KV cache, one code path for prefill, chunked prefill,
decode and speculative verification.

KV pool of one layer: v_cache [num_blocks, block_size, n_kv_heads, head_dim] and k_cache
[num_blocks, n_kv_heads, head_dim, block_size] (each block's keys transposed: a head dimension's
values of consecutive positions side by side, the lanes kernels_cpu.attention_tiles computes
16 scores in) of
- uint16: IEEE half bits (f16, the default; numba has no float16 type),
- float32 (f32),
with empty float32 arrays in the scale places (k_scale, v_scale); or, for llama.cpp's
quantized KV types (kernels_cpu.kv_quant: q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl), K and V alike
uint8 [num_blocks, block_size, n_kv_heads, row_bytes] (each (token, head) row head_dim / 32
GGML blocks, not transposed) with int64 [2] in the scale place: the GGML type id and the
Hadamard rotation the rows are stored with (kv_quant). K and
V may differ in type. A token at position j of
sequence s lives in block block_tables[s, j // block_size] at offset j % block_size. The
attention kernel itself is kernels_cpu.attention_tiles'.

Queries always read their keys and values back from the cache, including the ones written in
this very step, so a token's attention output is the same whether its context was computed in
this chunk or an earlier one (batch and chunking invariance).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from ._jit import f16_to_f32, f32_to_f16, kernel
from .kv_quant import head_dim_of, store_block_row


def value_at1(a, j):
    """float32 value of a[j] (a 1-D view of an f16 or f32 pool; overloaded per dtype)."""
    raise NotImplementedError


@overload(value_at1, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_value_at1(a, j):
    dt = a.dtype
    if isinstance(dt, types.Integer) and dt.bitwidth == 16:
        return lambda a, j: f16_to_f32(a[j])
    if isinstance(dt, types.Float):
        return lambda a, j: a[j]
    return None


def store_row(src, i, g, cache, scale, blk, off, hd):
    """cache[blk, off, g, :] = src[i, g*hd:(g+1)*hd] in the cache's representation (a V pool;
    a block type's when scale is its int64 [2] (type id, rotation))."""
    raise NotImplementedError


def store_key(src, i, g, cache, scale, blk, off, hd):
    """store_row for the K pool: an f16 / f32 pool's transposed blocks cache[blk, g, :, off],
    a block type's rows as V's."""
    raise NotImplementedError


def _store_impl(key: bool) -> Callable[..., Any]:
    """The overload of store_row (key False) or store_key (True) for the cache's dtype."""

    def ov(src, i, g, cache, scale, blk, off, hd):
        dt = cache.dtype
        if isinstance(scale.dtype, types.Integer):
            def blocks(src, i, g, cache, scale, blk, off, hd):
                # a block type (kernels_cpu.kv_quant): K and V rows alike, [block, offset, head, bytes]
                store_block_row(scale, src[i, g * hd : g * hd + hd], cache[blk, off, g])
            return blocks
        if isinstance(dt, types.Integer) and dt.bitwidth == 16:
            def f16(src, i, g, cache, scale, blk, off, hd):
                sr = src[i, g * hd : g * hd + hd]  # views, loops from 0: no index wrapping
                if key:  # a column of the transposed block
                    kc = cache[blk, g]
                    for d in range(hd):
                        kc[d, off] = f32_to_f16(sr[d])
                else:
                    vr = cache[blk, off, g]
                    for d in range(hd):
                        vr[d] = f32_to_f16(sr[d])
            return f16
        if isinstance(dt, types.Float):
            def f32(src, i, g, cache, scale, blk, off, hd):
                sr = src[i, g * hd : g * hd + hd]
                if key:
                    kc = cache[blk, g]
                    for d in range(hd):
                        kc[d, off] = sr[d]
                else:
                    vr = cache[blk, off, g]
                    for d in range(hd):
                        vr[d] = sr[d]
            return f32
        return None

    return ov


overload(store_row, inline="always", jit_options={"cache": True})(_store_impl(False))  # type: ignore[typeddict-unknown-key]
overload(store_key, inline="always", jit_options={"cache": True})(_store_impl(True))  # type: ignore[typeddict-unknown-key]


@kernel(parallel=True)
def store_kv_kernel(k, v, slot_mapping, k_cache, k_scale, v_cache, v_scale):
    """Write this step's keys and values into the pool. k, v: float32 [N, n_kv_heads * head_dim];
    slot_mapping: int64 [N] (block * block_size + offset; negative = skip); k_scale, v_scale:
    empty float32, or int64 [2] a block-quantized pool's type and rotation (kernels_cpu.attention)."""
    bs, n_kv = v_cache.shape[1], v_cache.shape[2]
    hd = head_dim_of(v_cache, v_scale)
    for i in numba.prange(k.shape[0]):
        slot = slot_mapping[i]
        if slot < 0:
            continue
        b = slot // bs
        o = slot % bs
        for g in range(n_kv):
            store_key(k, i, g, k_cache, k_scale, b, o, hd)
            store_row(v, i, g, v_cache, v_scale, b, o, hd)


@kernel(inline=True)
def _norm_span(x, t, o, n, norm_w, eps):
    """RMSNorm of x[t, o:o+n] in place (a sum of squares in float64), times norm_w [n]."""
    xr = x[t, o : o + n]  # a view, loops from 0: contiguous, no index wrapping
    s = 0.0
    for d in range(n):
        v = np.float64(xr[d])
        s += v * v
    sc = np.float32(1.0 / np.sqrt(s / n + eps))
    for d in range(n):
        xr[d] = np.float32(xr[d] * sc) * norm_w[d]


@kernel(inline=True)
def _head_norm_rope(x, t, h, hd, n_rot, norm_w, has_norm, cos, sin, neox, eps):
    o = h * hd
    if has_norm:
        _norm_span(x, t, o, hd, norm_w, eps)
    half = n_rot // 2
    if neox:  # pairs (i, i + half): two contiguous views, a loop that vectorizes
        xa, xb = x[t, o : o + half], x[t, o + half : o + n_rot]
        for i in range(half):
            x0, x1 = xa[i], xb[i]
            xa[i] = x0 * cos[i] - x1 * sin[i]
            xb[i] = x0 * sin[i] + x1 * cos[i]
    else:  # pairs (2i, 2i + 1)
        xr = x[t, o : o + n_rot]
        for i in range(half):
            x0, x1 = xr[2 * i], xr[2 * i + 1]
            xr[2 * i] = x0 * cos[i] - x1 * sin[i]
            xr[2 * i + 1] = x0 * sin[i] + x1 * cos[i]


@kernel(inline=True)
def _qkv_finish_token(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                      slot_mapping, k_cache, k_scale, v_cache, v_scale, t):
    hd = head_dim_of(v_cache, v_scale)
    n_heads, n_kv = q.shape[1] // hd, k.shape[1] // hd  # k: a KV-shared layer's stand-in may be wider
    # a norm as wide as the whole row (olmo2) is applied before the heads are rotated
    full_norm = q_norm.shape[0] == q.shape[1] and n_heads > 1
    has_bias, has_norm = bq.shape[0] > 0, q_norm.shape[0] > 0 and not full_norm
    bs = v_cache.shape[1]
    if has_bias:
        qr, kr, vr = q[t], k[t], v[t]  # row views: loops from 0, no index wrapping
        for c in range(q.shape[1]):
            qr[c] += bq[c]
        for c in range(k.shape[1]):
            kr[c] += bk[c]
            vr[c] += bv[c]
    if full_norm:
        _norm_span(q, t, 0, q.shape[1], q_norm, eps)
        _norm_span(k, t, 0, k.shape[1], k_norm, eps)
    p = np.float64(positions[t])
    cos = np.empty(n_rot // 2, np.float32)  # the rotation angles of this position, once for all heads
    sin = np.empty(n_rot // 2, np.float32)
    for i in range(n_rot // 2):
        th = p * inv_freq[i]
        cos[i] = np.float32(np.cos(th) * mscale)
        sin[i] = np.float32(np.sin(th) * mscale)
    for h in range(n_heads):
        _head_norm_rope(q, t, h, hd, n_rot, q_norm, has_norm, cos, sin, neox, eps)
    for h in range(n_kv):
        _head_norm_rope(k, t, h, hd, n_rot, k_norm, has_norm, cos, sin, neox, eps)
    slot = slot_mapping[t]
    if slot >= 0:
        for g in range(n_kv):
            store_key(k, t, g, k_cache, k_scale, slot // bs, slot % bs, hd)
            store_row(v, t, g, v_cache, v_scale, slot // bs, slot % bs, hd)


@kernel(parallel=True)
def qkv_finish_kernel(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                      slot_mapping, k_cache, k_scale, v_cache, v_scale):
    """Everything between the Q/K/V projections and attention, per token: biases (when bq has
    elements), RMSNorm of Q and K (when q_norm has elements: per head for a head_dim-long q_norm,
    gemma's and qwen3's QK-norm; over the whole row for a row-long one, olmo2's), RoPE of Q and K
    (inv_freq: float64 [n_rot / 2], each pair's angle per position, all zero for a layer without
    RoPE; cos and sin are multiplied by mscale, YaRN's and longrope's attention factor; neox:
    rotate pairs (i, i + n_rot / 2) instead of (2i, 2i + 1); dimensions past n_rot are left as
    they are), and the K/V store into the pool.
    The same per-element arithmetic as the separate kernels, in one launch (none for a single
    token: the launch would cost more than the work)."""
    if q.shape[0] == 1:
        _qkv_finish_token(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                          slot_mapping, k_cache, k_scale, v_cache, v_scale, 0)
    else:
        for t in numba.prange(q.shape[0]):
            _qkv_finish_token(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                              slot_mapping, k_cache, k_scale, v_cache, v_scale, t)
