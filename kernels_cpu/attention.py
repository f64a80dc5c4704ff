"""Paged attention over a block-table KV cache, one code path for prefill, chunked prefill,
decode and speculative verification.

KV pool of one layer: k_cache, v_cache [num_blocks, block_size, n_kv_heads, head_dim], either
uint16 (IEEE half bits: numba has no float16) or float32. A token at position j of sequence s
lives in block block_tables[s, j // block_size] at offset j % block_size.

Queries always read their keys and values back from the cache, including the ones written in
this very step, so a token's attention output is the same whether its context was computed in
this chunk or an earlier one (batch and chunking invariance).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from ._jit import f16_to_f32, f32_to_f16, kernel


def cache_load(v):  # type: ignore[no-untyped-def]
    """float32 of one stored KV value (overloaded per cache dtype)."""
    raise NotImplementedError  # only called from jitted code


@overload(cache_load, jit_options={"cache": True})
def _cache_load(v):  # type: ignore[no-untyped-def]
    if isinstance(v, types.Integer) and v.bitwidth == 16:
        return lambda v: f16_to_f32(v)
    if isinstance(v, types.Float):
        return lambda v: np.float32(v)
    return None


def _store_value(v, like):  # type: ignore[no-untyped-def]
    """`v` (float32) in the representation of the array `like` (overloaded per cache dtype)."""
    raise NotImplementedError


@overload(_store_value, jit_options={"cache": True})
def _ov_store_value(v, like):  # type: ignore[no-untyped-def]
    if isinstance(like, types.Array) and isinstance(like.dtype, types.Integer) and like.dtype.bitwidth == 16:
        return lambda v, like: f32_to_f16(v)
    if isinstance(like, types.Array) and isinstance(like.dtype, types.Float):
        return lambda v, like: np.float32(v)
    return None


@kernel(parallel=True)
def store_kv_kernel(k, v, slot_mapping, k_cache, v_cache):  # type: ignore[no-untyped-def]
    """Write this step's keys and values into the pool. k, v: float32 [N, n_kv_heads * head_dim];
    slot_mapping: int64 [N] (block * block_size + offset; negative = skip)."""
    bs, n_kv, hd = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    for i in numba.prange(k.shape[0]):
        slot = slot_mapping[i]
        if slot < 0:
            continue
        b = slot // bs
        o = slot % bs
        for g in range(n_kv):
            for d in range(hd):
                k_cache[b, o, g, d] = _store_value(k[i, g * hd + d], k_cache)
                v_cache[b, o, g, d] = _store_value(v[i, g * hd + d], v_cache)


@kernel(fastmath=True)
def _dot(a, ao, b, n):  # type: ignore[no-untyped-def]
    s = np.float32(0.0)
    for d in range(n):
        s += a[ao + d] * b[d]
    return s


@kernel
def _attend_one(q, i, g, n_rep, hd, p, lo, s, block_tables, k_cache, v_cache, scale, scores, row, acc, out):  # type: ignore[no-untyped-def]
    bs = k_cache.shape[1]
    n = p + 1 - lo
    # pass 1: scores of the n_rep query heads of kv-group g against keys lo..p
    for j in range(lo, p + 1):
        blk = block_tables[s, j // bs]
        off = j % bs
        for d in range(hd):
            row[d] = cache_load(k_cache[blk, off, g, d])
        for r in range(n_rep):
            scores[r, j - lo] = _dot(q[i], (g * n_rep + r) * hd, row, hd) * scale
    # numerically stable softmax, then the weighted sum of values in key order
    for r in range(n_rep):
        m = scores[r, 0]
        for j in range(1, n):
            m = max(m, scores[r, j])
        tot = np.float32(0.0)
        for j in range(n):
            e = np.float32(math.exp(scores[r, j] - m))
            scores[r, j] = e
            tot += e
        inv = np.float32(1.0) / tot
        for j in range(n):
            scores[r, j] *= inv
    acc[:n_rep, :hd] = 0.0
    for j in range(lo, p + 1):
        blk = block_tables[s, j // bs]
        off = j % bs
        for d in range(hd):
            row[d] = cache_load(v_cache[blk, off, g, d])
        for r in range(n_rep):
            w = scores[r, j - lo]
            for d in range(hd):
                acc[r, d] += w * row[d]
    for r in range(n_rep):
        for d in range(hd):
            out[i, (g * n_rep + r) * hd + d] = acc[r, d]


@kernel(parallel=True)
def paged_attention_kernel(q, k_cache, v_cache, block_tables, token_seq, positions, scale, window, out, n_threads):  # type: ignore[no-untyped-def]
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
            _attend_one(q, i, g, n_rep, hd, p, lo, token_seq[i], block_tables, k_cache, v_cache, scale,
                        scores, row, acc, out)
