"""Paged attention over a block-table KV cache, one code path for prefill, chunked prefill,
decode and speculative verification.

KV pool of one layer: k_cache, v_cache [num_blocks, block_size, n_kv_heads, head_dim] of
- uint16: IEEE half bits (f16, the default; numba has no float16 type),
- float32 (f32), or
- int8 (q8_0): values q with a float32 scale s per (token, head) in k_scale, v_scale
  [num_blocks, block_size, n_kv_heads]; value = q * s, s = max|x| / 127. Half the memory of f16.
For f16 and f32 the scale arrays are unused (pass empty ones). A token at position j of
sequence s lives in block block_tables[s, j // block_size] at offset j % block_size.

Queries always read their keys and values back from the cache, including the ones written in
this very step, so a token's attention output is the same whether its context was computed in
this chunk or an earlier one (batch and chunking invariance).
"""

from __future__ import annotations

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from ._jit import f16_to_f32, f32_to_f16, kernel
from .fastmath import fast_exp


def load_row(cache, scale, blk, off, g, row):  # type: ignore[no-untyped-def]
    """row[:] = float32 values of cache[blk, off, g, :] (overloaded per cache dtype)."""
    raise NotImplementedError  # only called from jitted code


@overload(load_row, jit_options={"cache": True})
def _ov_load_row(cache, scale, blk, off, g, row):  # type: ignore[no-untyped-def]
    dt = cache.dtype
    if isinstance(dt, types.Integer) and dt.bitwidth == 16:
        def f16(cache, scale, blk, off, g, row):  # type: ignore[no-untyped-def]
            for d in range(row.shape[0]):
                row[d] = f16_to_f32(cache[blk, off, g, d])
        return f16
    if isinstance(dt, types.Integer) and dt.bitwidth == 8:
        def q8(cache, scale, blk, off, g, row):  # type: ignore[no-untyped-def]
            s = scale[blk, off, g]
            for d in range(row.shape[0]):
                row[d] = np.float32(cache[blk, off, g, d]) * s
        return q8
    if isinstance(dt, types.Float):
        def f32(cache, scale, blk, off, g, row):  # type: ignore[no-untyped-def]
            for d in range(row.shape[0]):
                row[d] = cache[blk, off, g, d]
        return f32
    return None


def store_row(src, i, g, cache, scale, blk, off):  # type: ignore[no-untyped-def]
    """cache[blk, off, g, :] = src[i, g*hd:(g+1)*hd] in the cache's representation."""
    raise NotImplementedError


@overload(store_row, jit_options={"cache": True})
def _ov_store_row(src, i, g, cache, scale, blk, off):  # type: ignore[no-untyped-def]
    dt = cache.dtype
    if isinstance(dt, types.Integer) and dt.bitwidth == 16:
        def f16(src, i, g, cache, scale, blk, off):  # type: ignore[no-untyped-def]
            hd = cache.shape[3]
            for d in range(hd):
                cache[blk, off, g, d] = f32_to_f16(src[i, g * hd + d])
        return f16
    if isinstance(dt, types.Integer) and dt.bitwidth == 8:
        def q8(src, i, g, cache, scale, blk, off):  # type: ignore[no-untyped-def]
            # q8_0-style: one float32 scale per (token, head), values rounded to int8
            hd = cache.shape[3]
            amax = np.float32(0.0)
            for d in range(hd):
                amax = max(amax, abs(src[i, g * hd + d]))
            s = amax / np.float32(127.0)
            inv = np.float32(0.0) if s == 0 else np.float32(1.0) / s
            scale[blk, off, g] = s
            for d in range(hd):
                cache[blk, off, g, d] = np.int8(np.rint(src[i, g * hd + d] * inv))
        return q8
    if isinstance(dt, types.Float):
        def f32(src, i, g, cache, scale, blk, off):  # type: ignore[no-untyped-def]
            hd = cache.shape[3]
            for d in range(hd):
                cache[blk, off, g, d] = src[i, g * hd + d]
        return f32
    return None


@kernel(parallel=True)
def store_kv_kernel(k, v, slot_mapping, k_cache, k_scale, v_cache, v_scale):  # type: ignore[no-untyped-def]
    """Write this step's keys and values into the pool. k, v: float32 [N, n_kv_heads * head_dim];
    slot_mapping: int64 [N] (block * block_size + offset; negative = skip); k_scale, v_scale:
    float32 [num_blocks, block_size, n_kv_heads] for an int8 (q8_0) pool, unused otherwise."""
    bs, n_kv = k_cache.shape[1], k_cache.shape[2]
    for i in numba.prange(k.shape[0]):
        slot = slot_mapping[i]
        if slot < 0:
            continue
        b = slot // bs
        o = slot % bs
        for g in range(n_kv):
            store_row(k, i, g, k_cache, k_scale, b, o)
            store_row(v, i, g, v_cache, v_scale, b, o)


@kernel(fastmath=True)
def _dot(a, ao, b, n):  # type: ignore[no-untyped-def]
    s = np.float32(0.0)
    for d in range(n):
        s += a[ao + d] * b[d]
    return s


@kernel
def _attend_one(q, i, g, n_rep, hd, p, lo, s, block_tables, k_cache, k_scale, v_cache, v_scale, scale, scores, row, acc, out):  # type: ignore[no-untyped-def]
    bs = k_cache.shape[1]
    n = p + 1 - lo
    # pass 1: scores of the n_rep query heads of kv-group g against keys lo..p
    for j in range(lo, p + 1):
        blk = block_tables[s, j // bs]
        off = j % bs
        load_row(k_cache, k_scale, blk, off, g, row)
        for r in range(n_rep):
            scores[r, j - lo] = _dot(q[i], (g * n_rep + r) * hd, row, hd) * scale
    # numerically stable softmax, then the weighted sum of values in key order
    for r in range(n_rep):
        m = scores[r, 0]
        for j in range(1, n):
            m = max(m, scores[r, j])
        tot = np.float32(0.0)
        for j in range(n):
            e = fast_exp(scores[r, j] - m)
            scores[r, j] = e
            tot += e
        inv = np.float32(1.0) / tot
        for j in range(n):
            scores[r, j] *= inv
    acc[:n_rep, :hd] = 0.0
    for j in range(lo, p + 1):
        blk = block_tables[s, j // bs]
        off = j % bs
        load_row(v_cache, v_scale, blk, off, g, row)
        for r in range(n_rep):
            w = scores[r, j - lo]
            for d in range(hd):
                acc[r, d] += w * row[d]
    for r in range(n_rep):
        for d in range(hd):
            out[i, (g * n_rep + r) * hd + d] = acc[r, d]


@kernel(parallel=True)
def paged_attention_kernel(q, k_cache, k_scale, v_cache, v_scale, block_tables, token_seq, positions, scale, window, out, n_threads):  # type: ignore[no-untyped-def]
    """Causal attention of every query token against its own sequence's cached keys.

    q: float32 [N, n_heads * head_dim] (RoPE applied); token_seq: int32 [N] row of block_tables
    for each token; positions: int32 [N]; window: 0 = full attention, else a key at position j
    is visible to a query at p only if p - j < window (sliding-window layers);
    out: float32 [N, n_heads * head_dim]. Work items (token, kv-head) are split over n_threads.
    """
    N = q.shape[0]
    n_kv, hd = k_cache.shape[2], k_cache.shape[3]
    n_rep = q.shape[1] // (n_kv * hd)
    max_ctx = 1
    for i in range(N):
        max_ctx = max(max_ctx, positions[i] + 1)
    items = N * n_kv
    per = (items + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        scores = np.empty((n_rep, max_ctx), np.float32)
        row = np.empty(hd, np.float32)
        acc = np.empty((n_rep, hd), np.float32)
        for it in range(tid * per, min(items, (tid + 1) * per)):
            i = it // n_kv
            g = it % n_kv
            p = positions[i]
            lo = 0
            if window > 0:
                lo = max(0, p - window + 1)
            _attend_one(q, i, g, n_rep, hd, p, lo, token_seq[i], block_tables, k_cache, k_scale, v_cache, v_scale,
                        scale, scores, row, acc, out)
