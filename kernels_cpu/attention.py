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

from ._jit import REORDER, f16_to_f32, f32_to_f16, fmadd, kernel
from .fastmath import fast_exp


def value_at(cache, blk, off, g, d):
    """float32 value of cache[blk, off, g, d] before its q8_0 scale (overloaded per dtype)."""
    raise NotImplementedError  # only called from jitted code


@overload(value_at, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_value_at(cache, blk, off, g, d):
    dt = cache.dtype
    if isinstance(dt, types.Integer) and dt.bitwidth == 16:
        return lambda cache, blk, off, g, d: f16_to_f32(cache[blk, off, g, d])
    if isinstance(dt, types.Integer) and dt.bitwidth == 8:
        return lambda cache, blk, off, g, d: np.float32(cache[blk, off, g, d])
    if isinstance(dt, types.Float):
        return lambda cache, blk, off, g, d: cache[blk, off, g, d]
    return None


def store_row(src, i, g, cache, scale, blk, off):
    """cache[blk, off, g, :] = src[i, g*hd:(g+1)*hd] in the cache's representation."""
    raise NotImplementedError


@overload(store_row, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_store_row(src, i, g, cache, scale, blk, off):
    dt = cache.dtype
    if isinstance(dt, types.Integer) and dt.bitwidth == 16:
        def f16(src, i, g, cache, scale, blk, off):
            hd = cache.shape[3]
            for d in range(hd):
                cache[blk, off, g, d] = f32_to_f16(src[i, g * hd + d])
        return f16
    if isinstance(dt, types.Integer) and dt.bitwidth == 8:
        def q8(src, i, g, cache, scale, blk, off):
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
        def f32(src, i, g, cache, scale, blk, off):
            hd = cache.shape[3]
            for d in range(hd):
                cache[blk, off, g, d] = src[i, g * hd + d]
        return f32
    return None


@kernel(parallel=True)
def store_kv_kernel(k, v, slot_mapping, k_cache, k_scale, v_cache, v_scale):
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


@kernel(inline=True)
def _load_rows(cache, scales, quant, blk, off, m, g, factor, kv, vs):
    """kv[u] = row off + u of block blk, kv-head g, as float32 (u < m); vs[u] = factor times
    the row's q8_0 scale, or factor for an f16/f32 pool."""
    for u in range(m):
        for d in range(cache.shape[3]):
            kv[u, d] = value_at(cache, blk, off + u, g, d)
        vs[u] = factor * scales[blk, off + u, g] if quant else factor


@kernel(fastmath=REORDER)
def _attend_query(q, i, g, r0, r1, s, block_tables, k_cache, k_scale, v_cache, v_scale, positions, scale,
                  window, softcap, sinks, sc, qh, kv, vs, acc, out):
    """Heads r0..r1-1 of kv group g for query token i of sequence s (block_tables row).

    GQA: the heads of a group share their keys and values, so each key and value row is read
    from the pool and converted to float32 once (into kv) for all of them. Three passes over the
    visible keys lo..p: scores (one dot product per key and head), softmax per head (max, then
    exp and sum), then the weighted sum of the value rows. Each head's arithmetic is the same
    sequence of operations whichever heads share the call and whatever else is in the batch
    (REORDER lets LLVM vectorize the dot products and sums, in the same way each time).
    sc: float32 [>= n_rep, >= p + 1]; qh, acc: float32 [>= n_rep, head_dim]; kv: [4, head_dim]; vs: [4].
    sinks: float32 [n_heads] (gpt-oss) each head's sink logit, in the softmax's max and sum with no
    value row; [0]: none."""
    bs, hd = k_cache.shape[1], k_cache.shape[3]
    n_rep = q.shape[1] // (k_cache.shape[2] * hd)
    quant = k_scale.shape[0] > 0
    p = positions[i]
    lo = max(0, p - window + 1) if window > 0 else 0
    n = p + 1 - lo
    nr = r1 - r0
    for r in range(nr):
        qoff = (g * n_rep + r0 + r) * hd
        qrow = q[i, qoff : qoff + hd]  # a view: q[i, qoff + d] would be a gather (qoff's sign is unknown)
        for d in range(hd):
            qh[r, d] = qrow[d]
    j = 0
    for b in range(lo // bs, p // bs + 1):
        blk = block_tables[s, b]
        o0, o1 = max(lo, b * bs) - b * bs, min(bs, p + 1 - b * bs)
        # four key rows per pass, as for the values below: each head's query row is loaded once
        # for the four dot products
        for off in range(o0, o1, 4):
            m = min(4, o1 - off)
            _load_rows(k_cache, k_scale, quant, blk, off, m, g, scale, kv, vs)
            if m == 4:
                k0, k1, k2, k3 = kv[0], kv[1], kv[2], kv[3]
                for r in range(nr):
                    t0 = t1 = t2 = t3 = np.float32(0.0)
                    for d in range(hd):
                        x = qh[r, d]
                        t0 = fmadd(x, k0[d], t0)
                        t1 = fmadd(x, k1[d], t1)
                        t2 = fmadd(x, k2[d], t2)
                        t3 = fmadd(x, k3[d], t3)
                    sc[r, j], sc[r, j + 1], sc[r, j + 2], sc[r, j + 3] = t0 * vs[0], t1 * vs[1], t2 * vs[2], t3 * vs[3]
            else:
                for u in range(m):
                    ku = kv[u]
                    for r in range(nr):
                        t0 = np.float32(0.0)
                        for d in range(hd):
                            t0 = fmadd(qh[r, d], ku[d], t0)
                        sc[r, j + u] = t0 * vs[u]
            j += m
    inv_cap = np.float32(1.0) / softcap if softcap > 0 else np.float32(0.0)
    for r in range(nr):
        if softcap > 0:  # gemma2: scores = cap * tanh(scores / cap)
            for j in range(n):
                sc[r, j] = np.float32(np.tanh(sc[r, j] * inv_cap)) * softcap
        mx = sc[r, 0]
        for j in range(1, n):
            mx = max(mx, sc[r, j])
        sink = sinks[g * n_rep + r0 + r] if sinks.shape[0] > 0 else np.float32(0.0)
        if sinks.shape[0] > 0:
            mx = max(mx, sink)
        den = np.float32(0.0)
        for j in range(n):
            e = fast_exp(sc[r, j] - mx)
            sc[r, j] = e
            den += e
        if sinks.shape[0] > 0:  # ggml's soft_max with sinks: the sink joins the sum after the keys
            den += fast_exp(sink - mx)
        qh[r, 0] = np.float32(1.0) / den  # qh is free now: it keeps each head's 1 / sum
        for d in range(hd):
            acc[r, d] = 0.0
    j = 0
    for b in range(lo // bs, p // bs + 1):
        blk = block_tables[s, b]
        o0, o1 = max(lo, b * bs) - b * bs, min(bs, p + 1 - b * bs)
        # four value rows per pass over acc (the last pass of a block takes the 1-3 left):
        # a quarter of the loads and stores of acc, which bound this loop otherwise
        for off in range(o0, o1, 4):
            m = min(4, o1 - off)
            _load_rows(v_cache, v_scale, quant, blk, off, m, g, np.float32(1.0), kv, vs)
            if m == 4:
                v0, v1, v2, v3 = kv[0], kv[1], kv[2], kv[3]
                for r in range(nr):
                    w0, w1, w2, w3 = sc[r, j], sc[r, j + 1], sc[r, j + 2], sc[r, j + 3]
                    if quant:
                        w0, w1, w2, w3 = w0 * vs[0], w1 * vs[1], w2 * vs[2], w3 * vs[3]
                    for d in range(hd):
                        acc[r, d] = fmadd(w3, v3[d], fmadd(w2, v2[d], fmadd(w1, v1[d], fmadd(w0, v0[d], acc[r, d]))))
            else:
                for u in range(m):
                    vu = kv[u]
                    for r in range(nr):
                        w0 = sc[r, j + u] * vs[u] if quant else sc[r, j + u]
                        for d in range(hd):
                            acc[r, d] = fmadd(w0, vu[d], acc[r, d])
            j += m
    for r in range(nr):
        qoff = (g * n_rep + r0 + r) * hd
        orow = out[i, qoff : qoff + hd]
        inv = qh[r, 0]
        for d in range(hd):
            orow[d] = acc[r, d] * inv


@kernel(parallel=True)
def paged_attention_kernel(q, k_cache, k_scale, v_cache, v_scale, block_tables, token_seq, positions, scale, window,
                           softcap, sinks, out, n_threads):
    """Causal attention of every query token against its own sequence's cached keys.

    q: float32 [N, n_heads * head_dim] (RoPE applied); token_seq: int32 [N] row of block_tables
    for each token; positions: int32 [N]; window: 0 = full attention, else a key at position j
    is visible to a query at p only if p - j < window (sliding-window layers); softcap: 0 = none,
    else each score (q.k times scale) becomes softcap * tanh(score / softcap); sinks: float32
    [n_heads] attention sinks (gpt-oss: a per-head logit with no value) or [0]; out: float32
    [N, n_heads * head_dim]. Work items (query token, kv-head) are dealt to the n_threads
    threads round-robin; when there are fewer of them than threads (decoding one sequence of a
    model with one kv-head), or a few that the threads cannot share evenly, each query head is an
    item of its own.
    """
    N = q.shape[0]
    n_kv, hd = k_cache.shape[2], k_cache.shape[3]
    n_rep = q.shape[1] // (n_kv * hd)
    longest = 1
    for t in range(N):
        longest = max(longest, positions[t] + 1)
    # a few (query, kv-head) items that do not divide among the threads (one token of a model
    # with 3 kv-heads on 2 threads) are split into query heads, which balance better
    split = n_rep if N * n_kv < n_threads or (N * n_kv % n_threads and N * n_kv < 4 * n_threads) else 1
    items = N * n_kv * split
    for tid in numba.prange(n_threads):
        sc = np.empty((n_rep, longest), np.float32)
        acc = np.empty((n_rep, hd), np.float32)
        qh = np.empty((n_rep, hd), np.float32)
        kv = np.empty((4, hd), np.float32)
        vs = np.empty(4, np.float32)
        for it in range(tid, items, n_threads):
            i, rest = it // (n_kv * split), it % (n_kv * split)
            g, part = rest // split, rest % split
            r0, r1 = part * n_rep // split, (part + 1) * n_rep // split
            _attend_query(q, i, g, r0, r1, token_seq[i], block_tables, k_cache, k_scale, v_cache, v_scale,
                          positions, scale, window, softcap, sinks, sc, qh, kv, vs, acc, out)


@kernel(inline=True)
def _norm_span(x, t, o, n, norm_w, eps):
    """RMSNorm of x[t, o:o+n] in place (a sum of squares in float64), times norm_w [n]."""
    s = 0.0
    for d in range(n):
        v = np.float64(x[t, o + d])
        s += v * v
    sc = np.float32(1.0 / np.sqrt(s / n + eps))
    for d in range(n):
        x[t, o + d] = np.float32(x[t, o + d] * sc) * norm_w[d]


@kernel(inline=True)
def _head_norm_rope(x, t, h, hd, n_rot, norm_w, has_norm, cos, sin, neox, eps):
    o = h * hd
    if has_norm:
        _norm_span(x, t, o, hd, norm_w, eps)
    half = n_rot // 2
    for i in range(half):
        if neox:
            a, b = o + i, o + i + half
        else:
            a, b = o + 2 * i, o + 2 * i + 1
        x0 = x[t, a]
        x1 = x[t, b]
        x[t, a] = x0 * cos[i] - x1 * sin[i]
        x[t, b] = x0 * sin[i] + x1 * cos[i]


@kernel(inline=True)
def _qkv_finish_token(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                      slot_mapping, k_cache, k_scale, v_cache, v_scale, t):
    hd = k_cache.shape[3]
    n_heads, n_kv = q.shape[1] // hd, k.shape[1] // hd
    # a norm as wide as the whole row (olmo2) is applied before the heads are rotated
    full_norm = q_norm.shape[0] == q.shape[1] and n_heads > 1
    has_bias, has_norm = bq.shape[0] > 0, q_norm.shape[0] > 0 and not full_norm
    bs = k_cache.shape[1]
    if has_bias:
        for c in range(q.shape[1]):
            q[t, c] += bq[c]
        for c in range(k.shape[1]):
            k[t, c] += bk[c]
            v[t, c] += bv[c]
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
            store_row(k, t, g, k_cache, k_scale, slot // bs, slot % bs)
            store_row(v, t, g, v_cache, v_scale, slot // bs, slot % bs)


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
