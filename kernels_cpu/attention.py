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


def load_row(cache, scale, blk, off, g, tile, t):  # type: ignore[no-untyped-def]
    """tile[t, :] = float32 values of cache[blk, off, g, :] (overloaded per cache dtype)."""
    raise NotImplementedError  # only called from jitted code


@overload(load_row, inline="always", jit_options={"cache": True})
def _ov_load_row(cache, scale, blk, off, g, tile, t):  # type: ignore[no-untyped-def]
    dt = cache.dtype
    if isinstance(dt, types.Integer) and dt.bitwidth == 16:
        def f16(cache, scale, blk, off, g, tile, t):  # type: ignore[no-untyped-def]
            for d in range(tile.shape[1]):
                tile[t, d] = f16_to_f32(cache[blk, off, g, d])
        return f16
    if isinstance(dt, types.Integer) and dt.bitwidth == 8:
        def q8(cache, scale, blk, off, g, tile, t):  # type: ignore[no-untyped-def]
            s = scale[blk, off, g]
            for d in range(tile.shape[1]):
                tile[t, d] = np.float32(cache[blk, off, g, d]) * s
        return q8
    if isinstance(dt, types.Float):
        def f32(cache, scale, blk, off, g, tile, t):  # type: ignore[no-untyped-def]
            for d in range(tile.shape[1]):
                tile[t, d] = cache[blk, off, g, d]
        return f32
    return None


def store_row(src, i, g, cache, scale, blk, off):  # type: ignore[no-untyped-def]
    """cache[blk, off, g, :] = src[i, g*hd:(g+1)*hd] in the cache's representation."""
    raise NotImplementedError


@overload(store_row, inline="always", jit_options={"cache": True})
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


QUERY_TILE = 16  # queries of one sequence that share each converted K/V block


@kernel(inline=True)
def _load_tile(cache, scale, blk, g, n, tile):  # type: ignore[no-untyped-def]
    """tile[j, :] = values of cache row j of block blk, kv head g, for j < n."""
    for j in range(n):
        load_row(cache, scale, blk, j, g, tile, j)


@kernel(inline=True)
def _transpose(tile, n, tile_t):  # type: ignore[no-untyped-def]
    for d in range(tile.shape[1]):
        for j in range(n):
            tile_t[d, j] = tile[j, d]


@kernel
def _attend_chunk(q, i0, nq, g, r0, r1, s, block_tables, k_cache, k_scale, v_cache, v_scale, positions, scale,
                  window, ktile, kt, vtile, sc, m, den, acc, out):  # type: ignore[no-untyped-def]
    """Queries i0..i0+nq-1 (one sequence, increasing positions) x heads r0..r1-1 of group g.

    Online softmax over the key blocks in ascending order: per query and head, keep the running
    max m, denominator den and weighted sum acc, rescaled when the max grows. The scores of a
    block are one matrix-vector product against the transposed K tile (lane j = key j, summed
    over d in order), so each score has a fixed summation order. Each query sees exactly the
    blocks and keys its own position (and window) selects, in the same order, whatever else is
    in the chunk: sharing converted K/V tiles changes no result."""
    bs, hd = k_cache.shape[1], k_cache.shape[3]
    n_rep = q.shape[1] // (k_cache.shape[2] * hd)
    lo_all, hi = positions[i0], positions[i0 + nq - 1]
    lo_all = max(0, lo_all - window + 1) if window > 0 else 0
    for qi in range(nq):
        for r in range(r0, r1):
            m[qi, r] = -np.inf
            den[qi, r] = 0.0
            for d in range(hd):
                acc[qi, r, d] = 0.0
    for b in range(lo_all // bs, hi // bs + 1):
        j0 = b * bs
        n = min(bs, hi + 1 - j0)
        blk = block_tables[s, b]
        _load_tile(k_cache, k_scale, blk, g, n, ktile)
        _transpose(ktile, n, kt)
        _load_tile(v_cache, v_scale, blk, g, n, vtile)
        for qi in range(nq):
            p = positions[i0 + qi]
            lo = max(0, p - window + 1) if window > 0 else 0
            a, e = max(j0, lo) - j0, min(j0 + n, p + 1) - j0
            if a >= e:
                continue
            for r in range(r0, r1):
                qoff = (g * n_rep + r) * hd
                if bs == 16:
                    # Sixteen named accumulators (each summed over d in order) stay in one
                    # vector register; a loop over the keys would send them through memory
                    # at every step of d.
                    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
                    s8 = s9 = s10 = s11 = s12 = s13 = s14 = s15 = np.float32(0.0)
                    for d in range(hd):
                        qd = q[i0 + qi, qoff + d]
                        s0 += qd * kt[d, 0]
                        s1 += qd * kt[d, 1]
                        s2 += qd * kt[d, 2]
                        s3 += qd * kt[d, 3]
                        s4 += qd * kt[d, 4]
                        s5 += qd * kt[d, 5]
                        s6 += qd * kt[d, 6]
                        s7 += qd * kt[d, 7]
                        s8 += qd * kt[d, 8]
                        s9 += qd * kt[d, 9]
                        s10 += qd * kt[d, 10]
                        s11 += qd * kt[d, 11]
                        s12 += qd * kt[d, 12]
                        s13 += qd * kt[d, 13]
                        s14 += qd * kt[d, 14]
                        s15 += qd * kt[d, 15]
                    sc[0] = s0
                    sc[1] = s1
                    sc[2] = s2
                    sc[3] = s3
                    sc[4] = s4
                    sc[5] = s5
                    sc[6] = s6
                    sc[7] = s7
                    sc[8] = s8
                    sc[9] = s9
                    sc[10] = s10
                    sc[11] = s11
                    sc[12] = s12
                    sc[13] = s13
                    sc[14] = s14
                    sc[15] = s15
                else:
                    for j in range(n):
                        sc[j] = 0.0
                    for d in range(hd):
                        qd = q[i0 + qi, qoff + d]
                        for j in range(n):
                            sc[j] += qd * kt[d, j]
                bm = -np.inf
                for j in range(a, e):
                    sc[j] *= scale
                    bm = max(bm, sc[j])
                m_new = max(m[qi, r], bm)
                for j in range(a, e):
                    sc[j] = fast_exp(sc[j] - m_new)
                corr = fast_exp(m[qi, r] - m_new)
                tot = den[qi, r] * corr
                for j in range(a, e):
                    tot += sc[j]
                den[qi, r] = tot
                m[qi, r] = m_new
                for d in range(hd):
                    acc[qi, r, d] *= corr
                for j in range(a, e):
                    w = sc[j]
                    for d in range(hd):
                        acc[qi, r, d] += w * vtile[j, d]
    for qi in range(nq):
        for r in range(r0, r1):
            inv = np.float32(1.0) / den[qi, r]
            for d in range(hd):
                out[i0 + qi, (g * n_rep + r) * hd + d] = acc[qi, r, d] * inv


@kernel(parallel=True)
def paged_attention_kernel(q, k_cache, k_scale, v_cache, v_scale, block_tables, token_seq, positions, scale, window, out, n_threads):  # type: ignore[no-untyped-def]
    """Causal attention of every query token against its own sequence's cached keys.

    q: float32 [N, n_heads * head_dim] (RoPE applied); token_seq: int32 [N] row of block_tables
    for each token (a sequence's tokens are consecutive, positions increasing); positions:
    int32 [N]; window: 0 = full attention, else a key at position j is visible to a query at p
    only if p - j < window (sliding-window layers); out: float32 [N, n_heads * head_dim].
    Work items (chunk of up to QUERY_TILE queries of one sequence, kv-head) are dealt to the
    n_threads threads round-robin; when there are fewer of them than threads (decoding one
    sequence of a model with one kv-head), each query head is an item of its own.
    """
    N = q.shape[0]
    n_kv, bs, hd = k_cache.shape[2], k_cache.shape[1], k_cache.shape[3]
    n_rep = q.shape[1] // (n_kv * hd)
    starts = np.empty(N + 1, np.int64)
    n_chunks = 0
    i = 0
    while i < N:
        starts[n_chunks] = i
        n_chunks += 1
        j = i + 1
        while j < N and j - i < QUERY_TILE and token_seq[j] == token_seq[i]:
            j += 1
        i = j
    starts[n_chunks] = N
    split = n_rep if n_chunks * n_kv < n_threads else 1
    items = n_chunks * n_kv * split
    for tid in numba.prange(n_threads):
        ktile = np.zeros((bs, hd), np.float32)  # zeros: lanes past a short block stay finite
        kt = np.zeros((hd, bs), np.float32)
        vtile = np.zeros((bs, hd), np.float32)
        sc = np.empty(bs, np.float32)
        m = np.empty((QUERY_TILE, n_rep), np.float32)
        den = np.empty((QUERY_TILE, n_rep), np.float32)
        acc = np.empty((QUERY_TILE, n_rep, hd), np.float32)
        for it in range(tid, items, n_threads):
            c, rest = it // (n_kv * split), it % (n_kv * split)
            g, part = rest // split, rest % split
            r0, r1 = part * n_rep // split, (part + 1) * n_rep // split
            i0 = starts[c]
            _attend_chunk(q, i0, starts[c + 1] - i0, g, r0, r1, token_seq[i0], block_tables, k_cache, k_scale,
                          v_cache, v_scale, positions, scale, window, ktile, kt, vtile, sc, m, den, acc, out)


@kernel(inline=True)
def _head_norm_rope(x, t, h, hd, n_rot, norm_w, has_norm, cos, sin, neox, eps):  # type: ignore[no-untyped-def]
    o = h * hd
    if has_norm:
        s = 0.0
        for d in range(hd):
            v = np.float64(x[t, o + d])
            s += v * v
        sc = np.float32(1.0 / np.sqrt(s / hd + eps))
        for d in range(hd):
            x[t, o + d] = np.float32(x[t, o + d] * sc) * norm_w[d]
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


@kernel(parallel=True)
def qkv_finish_kernel(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, neox, eps, slot_mapping,
                      k_cache, k_scale, v_cache, v_scale):  # type: ignore[no-untyped-def]
    """Everything between the Q/K/V projections and attention, per token: biases (when bq has
    elements), RMSNorm of each head of Q and K (when q_norm has elements: gemma's QK-norm), RoPE
    of Q and K (inv_freq: float64 [n_rot / 2], base^(-2i / n_rot) times the position scale;
    neox: rotate pairs (i, i + n_rot / 2) instead of (2i, 2i + 1); dimensions past n_rot are left
    as they are), and the K/V store into the pool.
    The same per-element arithmetic as the separate kernels, in one launch."""
    hd = k_cache.shape[3]
    n_heads, n_kv = q.shape[1] // hd, k.shape[1] // hd
    has_bias, has_norm = bq.shape[0] > 0, q_norm.shape[0] > 0
    bs = k_cache.shape[1]
    for t in numba.prange(q.shape[0]):
        if has_bias:
            for c in range(q.shape[1]):
                q[t, c] += bq[c]
            for c in range(k.shape[1]):
                k[t, c] += bk[c]
                v[t, c] += bv[c]
        p = np.float64(positions[t])
        cos = np.empty(n_rot // 2, np.float32)  # the rotation angles of this position, once for all heads
        sin = np.empty(n_rot // 2, np.float32)
        for i in range(n_rot // 2):
            th = p * inv_freq[i]
            cos[i] = np.float32(np.cos(th))
            sin[i] = np.float32(np.sin(th))
        for h in range(n_heads):
            _head_norm_rope(q, t, h, hd, n_rot, q_norm, has_norm, cos, sin, neox, eps)
        for h in range(n_kv):
            _head_norm_rope(k, t, h, hd, n_rot, k_norm, has_norm, cos, sin, neox, eps)
        slot = slot_mapping[t]
        if slot >= 0:
            for g in range(n_kv):
                store_row(k, t, g, k_cache, k_scale, slot // bs, slot % bs)
                store_row(v, t, g, v_cache, v_scale, slot // bs, slot % bs)
