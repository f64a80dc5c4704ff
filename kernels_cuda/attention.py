"""CUDA attention: the QKV finish (biases, QK-norms, RoPE, the K/V store) and paged attention
over the same block tables and KV layout as the CPU (k_cache, v_cache [num_blocks, block_size,
n_kv, hd], float16 or float32 values).

  qkv_finish_kernel(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq f64, mscale,
                    neox, eps, slot_mapping, k_cache, v_cache)        grid (N,), ROW threads
      as kernels_cpu's: angles position * inv_freq[i] in float64, cos and sin times mscale.
  attention_part_kernel(q, k_cache, v_cache, block_tables, token_seq, positions, scale, window,
                        softcap, part_m, part_l, part_acc)            grid (N, n_heads, parts)
      partition p covers keys [p * PART, (p + 1) * PART) of the token's window, in chunks of
      KEYS keys at absolute multiples of KEYS (online softmax); writes its max, sum and
      unnormalised output. Partitions start at absolute key positions, so a token's result does
      not depend on the batch or on chunked prefill.
  attention_combine_kernel(part_m, part_l, part_acc, out)              grid (N, n_heads)
      merges the partitions in order: out = sum_p acc_p e^(m_p - M) / sum_p l_p e^(m_p - M).
  copy_blocks_kernel(k_cache, v_cache, pairs i32 [C, 2])   block pairs[c, 0] -> pairs[c, 1].
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .intrinsics import LANES, block_max, block_sum

ROW = LANES  # threads of the per-token kernels
KEYS = LANES  # keys per chunk: one per thread
PART = 256  # keys per partition
MAX_HD = 256  # head_dim limit (per-thread accumulators hold MAX_HD / KEYS values)
NEG_INF = float32(-math.inf)
HALF_HD = MAX_HD // 2  # shared-array sizes must be module constants, not expressions
ACC = MAX_HD // KEYS


@cuda.jit(device=True)
def _norm_span(x, t, o, n, w, eps, sh):
    tid = cuda.threadIdx.x
    ss = float32(0.0)
    for d in range(tid, n, ROW):
        ss += x[t, o + d] * x[t, o + d]
    total = block_sum(sh, tid, ss)
    sc = float32(1.0) / math.sqrt(total / float32(n) + eps)
    for d in range(tid, n, ROW):
        x[t, o + d] = (x[t, o + d] * sc) * w[d]
    cuda.syncthreads()


@cuda.jit(device=True)
def _rotate(x, t, heads, hd, n_rot, neox, cosv, sinv):
    half = n_rot // 2
    for p in range(cuda.threadIdx.x, heads * half, ROW):
        o, i = (p // half) * hd, p % half
        a, b = (o + i, o + i + half) if neox else (o + 2 * i, o + 2 * i + 1)
        x0, x1 = x[t, a], x[t, b]
        x[t, a] = x0 * cosv[i] - x1 * sinv[i]
        x[t, b] = x0 * sinv[i] + x1 * cosv[i]


@cuda.jit
def qkv_finish_kernel(q, k, v, bq, bk, bv, q_norm, k_norm, n_rot, positions, inv_freq, mscale, neox, eps,
                      slot_mapping, k_cache, v_cache):
    t, tid = cuda.blockIdx.x, cuda.threadIdx.x
    sh = cuda.shared.array(ROW, np.float32)
    cosv = cuda.shared.array(HALF_HD, np.float32)
    sinv = cuda.shared.array(HALF_HD, np.float32)
    hd = k_cache.shape[3]
    n_heads, n_kv = q.shape[1] // hd, k.shape[1] // hd
    if bq.shape[0] > 0:
        for c in range(tid, q.shape[1], ROW):
            q[t, c] += bq[c]
        for c in range(tid, k.shape[1], ROW):
            k[t, c] += bk[c]
            v[t, c] += bv[c]
    cuda.syncthreads()
    if q_norm.shape[0] == q.shape[1] and n_heads > 1:  # one norm over the whole row (olmo2)
        _norm_span(q, t, 0, q.shape[1], q_norm, eps, sh)
        _norm_span(k, t, 0, k.shape[1], k_norm, eps, sh)
    elif q_norm.shape[0] > 0:
        for h in range(n_heads):
            _norm_span(q, t, h * hd, hd, q_norm, eps, sh)
        for h in range(n_kv):
            _norm_span(k, t, h * hd, hd, k_norm, eps, sh)
    p = float(positions[t])
    for i in range(tid, n_rot // 2, ROW):
        th = p * inv_freq[i]
        cosv[i] = float32(math.cos(th) * mscale)
        sinv[i] = float32(math.sin(th) * mscale)
    cuda.syncthreads()
    _rotate(q, t, n_heads, hd, n_rot, neox, cosv, sinv)
    _rotate(k, t, n_kv, hd, n_rot, neox, cosv, sinv)
    cuda.syncthreads()
    slot = slot_mapping[t]
    if slot >= 0:
        bs = k_cache.shape[1]
        blk, off = slot // bs, slot % bs
        for c in range(tid, k.shape[1], ROW):
            k_cache[blk, off, c // hd, c % hd] = k[t, c]
            v_cache[blk, off, c // hd, c % hd] = v[t, c]


@cuda.jit
def attention_part_kernel(q, k_cache, v_cache, block_tables, token_seq, positions, scale, window, softcap,
                          part_m, part_l, part_acc):
    t, h, part = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z
    tid = cuda.threadIdx.x
    sh = cuda.shared.array(KEYS, np.float32)
    probs = cuda.shared.array(KEYS, np.float32)
    slots = cuda.shared.array(KEYS, np.int32)
    acc = cuda.local.array(ACC, np.float32)
    bs, n_kv, hd = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    g = h // (q.shape[1] // hd // n_kv)
    pos = positions[t]
    lo = pos - window + 1 if window > 0 and pos - window + 1 > 0 else 0
    start = part * PART if part * PART > lo - lo % KEYS else lo - lo % KEYS
    end = (part + 1) * PART if (part + 1) * PART < pos + 1 else pos + 1
    for u in range(ACC):
        acc[u] = float32(0.0)
    m, l_sum = NEG_INF, float32(0.0)
    row = token_seq[t]
    for chunk in range(start, end, KEYS):
        j = chunk + tid
        s = NEG_INF
        if j >= lo and j < end:
            blk = block_tables[row, j // bs]
            slots[tid] = blk * bs + j % bs
            dot = float32(0.0)
            for d in range(hd):
                dot += q[t, h * hd + d] * float32(k_cache[blk, j % bs, g, d])
            s = float32(dot * scale)
            if softcap > float32(0.0):
                s = softcap * math.tanh(s / softcap)
        m_chunk = block_max(sh, tid, s)
        m_new = m if m > m_chunk else m_chunk
        pj = float32(math.exp(s - m_new)) if s != NEG_INF else float32(0.0)
        alpha = float32(math.exp(m - m_new)) if m != NEG_INF else float32(0.0)
        probs[tid] = pj
        cuda.syncthreads()
        l_sum = l_sum * alpha + block_sum(sh, tid, pj)
        for u in range(hd // KEYS + (1 if hd % KEYS else 0)):
            d = u * KEYS + tid
            if d < hd:
                a = acc[u] * alpha
                for jj in range(KEYS):
                    key = chunk + jj
                    if key >= lo and key < end:
                        sl = slots[jj]
                        a += probs[jj] * float32(v_cache[sl // bs, sl % bs, g, d])
                acc[u] = a
        m = m_new
        cuda.syncthreads()
    if tid == 0:
        part_m[t, h, part] = m
        part_l[t, h, part] = l_sum
    for u in range(hd // KEYS + (1 if hd % KEYS else 0)):
        d = u * KEYS + tid
        if d < hd:
            part_acc[t, h, part, d] = acc[u]


@cuda.jit
def attention_combine_kernel(part_m, part_l, part_acc, out):
    t, h = cuda.blockIdx.x, cuda.blockIdx.y
    hd = part_acc.shape[3]
    big = NEG_INF
    for p in range(part_m.shape[2]):
        if part_m[t, h, p] > big:
            big = part_m[t, h, p]
    total = float32(0.0)
    for p in range(part_m.shape[2]):
        if part_m[t, h, p] != NEG_INF:
            total += part_l[t, h, p] * float32(math.exp(part_m[t, h, p] - big))
    for d in range(cuda.threadIdx.x, hd, cuda.blockDim.x):
        a = float32(0.0)
        for p in range(part_m.shape[2]):
            if part_m[t, h, p] != NEG_INF:
                a += part_acc[t, h, p, d] * float32(math.exp(part_m[t, h, p] - big))
        out[t, h * hd + d] = a / total


@cuda.jit
def copy_blocks_kernel(k_cache, v_cache, pairs):
    c = cuda.blockIdx.x
    src, dst = pairs[c, 0], pairs[c, 1]
    n = k_cache.shape[1] * k_cache.shape[2] * k_cache.shape[3]
    inner = k_cache.shape[2] * k_cache.shape[3]
    hd = k_cache.shape[3]
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        a, b = i // inner, i % inner
        k_cache[dst, a, b // hd, b % hd] = k_cache[src, a, b // hd, b % hd]
        v_cache[dst, a, b // hd, b % hd] = v_cache[src, a, b // hd, b % hd]
