"""Paged attention in query tiles: one code path for prefill, chunked prefill, decode and
speculative verification (the pool's layout is kernels_cpu.attention's).

A work item is a tile of up to QUERY_TILE consecutive tokens of one sequence and one kv-head
group (or, with too few items for the threads, a share of the group's query heads). The
tile's query rows (tokens x heads) share every key and value row the pool holds for them: a
chunk of up to 16 keys is 16 vector lanes per head dimension (the K pool stores each block
transposed: [head dim][offset]), and up to eight rows that see one of the keys get 16 scores
(two chunks: 32) from one fused multiply-add per dimension (kernels_cpu.simd_attn.qk_lanes);
the chunk's value rows are added into the accumulators of every row that sees them, up to 4
rows x 64 dimensions held in registers over the chunk (pv_lanes). An f16 / f32 pool whose
blocks hold whole chunks is read in place, halves widened in the registers (on x86 with F16C),
and so is a Q8_0 / Q4_0 pool by a tile of a few rows (a decode step's), its codes widened and
scaled in the registers of each call (kernels_cpu.kv_lanes); any other chunk is converted to
float32 scratch once first (kernels_cpu.kv_read). All give the same floats: each decoding is
exact.

Per query row the arithmetic is fixed by the row alone: a score is the sequential chain of
fused multiply-adds over the head dimension (times the key's scale), the softmax runs over the
row's own keys, and the values are added in key order, one fused multiply-add per key and
dimension. So a token's output is the same bits whatever else is in its tile, its batch or its
chunk, and whatever the thread count.
"""

from __future__ import annotations

import numba
import numpy as np

from ._jit import REORDER, fmadd, kernel
from .fastmath import fast_exp
from .kv_lanes import block_scores, block_values, in_place_code
from .kv_quant import head_dim_of
from .kv_read import LANES, key_chunk, pool_flat, value_rows
from .simd_attn import pv_lanes, qk_lanes, row_max

QUERY_TILE = 16  # tokens per tile (fewer when the scores of a long context would not fit SCORE_BUDGET)
SCORE_BUDGET = 1 << 22  # float32 scores per thread's scratch (16 MB)
# The most query rows of a tile that read a Q8_0 / Q4_0 pool in place (each call of up to 8
# rows for keys, 4 for values, decodes the chunk again; a tile of more converts it once)
IN_PLACE_ROWS = 8


@kernel(inline=True)
def _value_slices(accf, a0, scf, w0, width, vsrc, v0, vstride, hd, nk, nrow, nsl):
    """pv_lanes over nrow rows (1 to 4) and nsl 16-lane slices (1, 2 or 4), as literals."""
    if nrow == 4:
        _value_slices_of(accf, a0, scf, w0, width, vsrc, v0, vstride, hd, nk, 4, nsl)
    elif nrow == 3:
        _value_slices_of(accf, a0, scf, w0, width, vsrc, v0, vstride, hd, nk, 3, nsl)
    elif nrow == 2:
        _value_slices_of(accf, a0, scf, w0, width, vsrc, v0, vstride, hd, nk, 2, nsl)
    else:
        _value_slices_of(accf, a0, scf, w0, width, vsrc, v0, vstride, hd, nk, 1, nsl)


@kernel(inline=True)
def _value_slices_of(accf, a0, scf, w0, width, vsrc, v0, vstride, hd, nk, nrow, nsl):
    """_value_slices once nrow is a literal (inlined: it stays one)."""
    if nsl == 4:
        pv_lanes(accf, a0, hd, scf, w0, width, vsrc, v0, vstride, nk, nrow, 4)
    elif nsl == 2:
        pv_lanes(accf, a0, hd, scf, w0, width, vsrc, v0, vstride, nk, nrow, 2)
    else:
        pv_lanes(accf, a0, hd, scf, w0, width, vsrc, v0, vstride, nk, nrow, 1)


@kernel(inline=True)
def _score_rows(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, rb, nch):
    """qk_lanes for rows row..rb-1 from column col, 8 per call, the rest in one call (a decode
    step's 3, 6 or 7 rows of a kv-head read its keys once); nch: a literal 1 or 2 chunks of 16
    keys (inlined: it stays one), at k0 and k1 of kt."""
    while row + 8 <= rb:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 8, nch)
        row += 8
    left = rb - row
    if left == 7:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 7, nch)
    elif left == 6:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 6, nch)
    elif left == 5:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 5, nch)
    elif left == 4:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 4, nch)
    elif left == 3:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 3, nch)
    elif left == 2:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 2, nch)
    elif left == 1:
        _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, 1, nch)


@kernel(inline=True)
def _score_n(scf, width, col, qh, hd, kt, k0, k1, kds, ks, row, n, nch):
    qk_lanes(scf, row * width + col, width, qh, row * hd, hd, kt, k0, k1, kds, hd, ks, n, nch)


@kernel(inline=True)
def _weighted_values(accf, sc, scf, kv, vsrc, vbase, vstride, ra, rb, col, ja, jb):
    """acc[row] += sc[row, col + j] * V[j] for rows ra..rb-1 and keys j = ja..jb-1, each (row,
    dimension) a fused multiply-add chain in key order; V[j]: vsrc[vbase + j * vstride:][:hd]
    (the converted rows kv, or a plain pool's block read in place), its dimensions past the
    last 16 from kv (a pool is read in place only when hd is a multiple of 16)."""
    hd, width = kv.shape[1], sc.shape[1]
    nk, whole = jb - ja, hd // LANES * LANES
    d0 = 0
    while d0 < whole:
        left = (whole - d0) // LANES
        nsl = 4 if left >= 4 else 2 if left >= 2 else 1
        row = ra
        while row < rb:
            nrow = min(4, rb - row)
            _value_slices(accf, row * hd + d0, scf, row * width + col + ja, width, vsrc, vbase + ja * vstride + d0,
                          vstride, hd, nk, nrow, nsl)
            row += nrow
        d0 += nsl * LANES
    for row in range(ra, rb):  # the dimensions past the last whole slice
        arow = accf[row * hd + whole : row * hd + hd]
        for j in range(ja, jb):
            w, vrow = sc[row, col + j], kv[j, whole:]
            for d in range(hd - whole):
                arow[d] = fmadd(w, vrow[d], arow[d])


@kernel(inline=True)
def _visible(positions, i, window):
    p = positions[i]
    return (max(0, p - window + 1) if window > 0 else 0), p


@kernel(fastmath=REORDER)
def _attend_tile(q, t0, t1, g, r0, r1, s, block_tables, k_cache, k_scale, v_cache, v_scale, positions, scale,
                 window, softcap, sinks, sc, qh, kt, ks, kv, acc, inv_den, out):
    """Heads r0..r1-1 of kv group g for query tokens t0..t1-1 of sequence s (block_tables row).
    Scratch: sc float32 [>= rows, width], qh float32 [>= rows * hd], kt [32 hd], ks [32], kv
    [16, hd], acc [>= rows, hd], inv_den [>= rows]; rows = (t1 - t0) * (r1 - r0)."""
    bs, n_kv, hd = v_cache.shape[1], v_cache.shape[2], kv.shape[1]
    n_rep = q.shape[1] // (n_kv * hd)
    nr = r1 - r0
    width = sc.shape[1]
    scf, kvf = sc.reshape(-1), kv.reshape(-1)
    # a plain pool (f16 / f32) with whole 16-key chunks is read in place by the lanes, no copy
    kflat, vflat = pool_flat(k_cache, k_scale), pool_flat(v_cache, v_scale)
    whole = bs % LANES == 0 and hd % LANES == 0
    direct, direct_v = whole and kflat.shape[0] > 0, whole and vflat.shape[0] > 0  # K's and V's pools apart
    # a Q8_0 / Q4_0 pool with whole 16-key chunks, read by a few rows (a decode step's): its codes
    # are decoded in the lanes of each call (kv_lanes); more rows share a chunk decoded once
    few = (t1 - t0) * nr <= IN_PLACE_ROWS
    blocks_k = few and whole and in_place_code(k_cache, k_scale) >= 0
    blocks_v = few and whole and in_place_code(v_cache, v_scale) >= 0
    if direct or blocks_k:  # key_chunk fills the keys' scales per chunk; read in place, every key's is `scale`
        for u in range(2 * LANES):
            ks[u] = scale
    ptile = positions[t0:t1]  # a view indexed from 0: its loops read it contiguously (no gathers)
    kmin, kmax = positions[t0], -1
    for i in range(t0, t1):
        lo, p = _visible(ptile, i - t0, window)
        kmin, kmax = min(kmin, lo), max(kmax, p)
        for r in range(nr):
            qoff = (g * n_rep + r0 + r) * hd
            qrow = q[i, qoff : qoff + hd]  # a view: q[i, qoff + d] would be a gather
            row = (i - t0) * nr + r
            qdst = qh[row * hd : row * hd + hd]  # views, loops from 0: contiguous, no gathers
            for d in range(hd):
                qdst[d] = qrow[d]
    cw = min(LANES, bs)
    kbase = kmin - kmin % cw
    kt2, ks2 = kt[LANES * hd :], ks[LANES:]
    c = kbase
    while c <= kmax:  # scores: chunks of cw keys (one block or 16 of it), two at a time where both are 16
        nch = 2 if cw == LANES and c + cw <= kmax else 1
        if not direct and not blocks_k:
            key_chunk(k_cache, k_scale, block_tables[s, c // bs], g, c % bs, cw, scale, kt, ks, kv)
            if nch == 2:
                key_chunk(k_cache, k_scale, block_tables[s, (c + cw) // bs], g, (c + cw) % bs, cw, scale, kt2, ks2, kv)
        qa, qb = t1, t0  # the tokens that see a key of the chunks (contiguous: positions ascend)
        for i in range(t0, t1):
            lo, p = _visible(ptile, i - t0, window)
            if lo < c + nch * cw and p >= c:
                qa, qb = min(qa, i), max(qb, i + 1)
        row, rb = (qa - t0) * nr, (qb - t0) * nr
        if direct:  # the blocks' [dimension][offset] runs: chunk h's dimension d at k_h + bs d
            k0 = (block_tables[s, c // bs] * n_kv + g) * hd * bs + c % bs
            k1 = (block_tables[s, (c + cw) // bs] * n_kv + g) * hd * bs + (c + cw) % bs if nch == 2 else k0
            if nch == 2:  # a row's scores of keys it does not see are computed, never read
                _score_rows(scf, width, c - kbase, qh, hd, kflat, k0, k1, bs, ks, row, rb, 2)
            else:
                _score_rows(scf, width, c - kbase, qh, hd, kflat, k0, k1, bs, ks, row, rb, 1)
        elif blocks_k:  # the chunks' first key rows
            k0 = (block_tables[s, c // bs] * bs + c % bs) * n_kv + g
            k1 = (block_tables[s, (c + cw) // bs] * bs + (c + cw) % bs) * n_kv + g if nch == 2 else k0
            block_scores(scf, width, c - kbase, qh, hd, k_cache, k_scale, k0, k1, row, rb, ks, nch)
        elif nch == 2:
            _score_rows(scf, width, c - kbase, qh, hd, kt, 0, LANES * hd, LANES, ks, row, rb, 2)
        else:
            _score_rows(scf, width, c - kbase, qh, hd, kt, 0, LANES * hd, LANES, ks, row, rb, 1)
        c += nch * cw
    inv_cap = np.float32(1.0) / softcap if softcap > 0 else np.float32(0.0)
    for i in range(t0, t1):  # softmax of each row over its own keys
        lo, p = _visible(ptile, i - t0, window)
        a, e = lo - kbase, p - kbase + 1
        for r in range(nr):
            row = (i - t0) * nr + r
            srow = sc[row, a:e]  # a view: loops from 0 vectorize
            if softcap > 0:  # gemma2: scores = cap * tanh(scores / cap)
                for j in range(e - a):
                    srow[j] = np.float32(np.tanh(srow[j] * inv_cap)) * softcap
            mx = row_max(scf, row * width + a, e - a)
            sink = sinks[g * n_rep + r0 + r] if sinks.shape[0] > 0 else np.float32(0.0)
            if sinks.shape[0] > 0:
                mx = max(mx, sink)
            den = np.float32(0.0)
            for j in range(e - a):
                x = fast_exp(srow[j] - mx)
                srow[j] = x
                den += x
            if sinks.shape[0] > 0:  # ggml's soft_max with sinks: the sink joins the sum after the keys
                den += fast_exp(sink - mx)
            inv_den[row] = np.float32(1.0) / den
            acc[row, :] = 0.0
    accf = acc.reshape(-1)
    vstride, vbase = hd, 0  # the converted rows kv
    if direct_v:
        vstride = n_kv * hd  # a block's rows of kv-head g, read in place
    for c in range(kbase, kmax + 1, cw):  # values, the scores' chunks: converted once for the tile's rows
        if direct_v:
            vbase = ((block_tables[s, c // bs] * bs + c % bs) * n_kv + g) * hd
        elif blocks_v:  # the chunk's first value row
            vbase = (block_tables[s, c // bs] * bs + c % bs) * n_kv + g
        else:
            value_rows(v_cache, v_scale, block_tables[s, c // bs], c % bs, cw, g, kv)
        fa, fb = t1, t0  # the tokens that see every key of the chunk (contiguous: positions ascend)
        for i in range(t0, t1):
            lo, p = _visible(ptile, i - t0, window)
            if lo <= c and p >= c + cw - 1:
                fa, fb = min(fa, i), max(fb, i + 1)
        if fa < fb:
            if blocks_v:
                block_values(accf, sc, scf, v_cache, v_scale, vbase, hd, (fa - t0) * nr, (fb - t0) * nr, c - kbase, 0, cw)
            elif direct_v:
                _weighted_values(accf, sc, scf, kv, vflat, vbase, vstride, (fa - t0) * nr, (fb - t0) * nr, c - kbase, 0, cw)
            else:
                _weighted_values(accf, sc, scf, kv, kvf, 0, hd, (fa - t0) * nr, (fb - t0) * nr, c - kbase, 0, cw)
        for i in range(t0, t1):  # the others see a run of it (the diagonal, a window's edge)
            lo, p = _visible(ptile, i - t0, window)
            ja, jb = max(lo, c) - c, min(p, c + cw - 1) - c + 1
            if (fa <= i < fb) or ja >= jb:
                continue
            if blocks_v:
                block_values(accf, sc, scf, v_cache, v_scale, vbase, hd, (i - t0) * nr, (i - t0 + 1) * nr, c - kbase,
                             ja, jb)
            elif direct_v:
                _weighted_values(accf, sc, scf, kv, vflat, vbase, vstride, (i - t0) * nr, (i - t0 + 1) * nr, c - kbase,
                                 ja, jb)
            else:
                _weighted_values(accf, sc, scf, kv, kvf, 0, hd, (i - t0) * nr, (i - t0 + 1) * nr, c - kbase, ja, jb)
    for i in range(t0, t1):
        for r in range(nr):
            row = (i - t0) * nr + r
            qoff = (g * n_rep + r0 + r) * hd
            orow, arow, inv = out[i, qoff : qoff + hd], acc[row], inv_den[row]
            for d in range(hd):
                orow[d] = arow[d] * inv


@kernel
def _tiles(token_seq, N, tile):
    """Start of each tile (consecutive tokens of one sequence, at most `tile`), then N."""
    starts = np.empty(N + 1, np.int64)
    n = 0
    for t in range(N):
        if t == 0 or token_seq[t] != token_seq[t - 1] or t - starts[n - 1] == tile:
            starts[n] = t
            n += 1
    starts[n] = N
    return starts[: n + 1]


@kernel(parallel=True)
def paged_attention_kernel(q, k_cache, k_scale, v_cache, v_scale, block_tables, token_seq, positions, scale, window,
                           softcap, sinks, out, n_threads):
    """Causal attention of every query token against its own sequence's cached keys.

    q: float32 [N, n_heads * head_dim] (RoPE applied); token_seq: int32 [N] row of block_tables
    for each token (a sequence's tokens consecutive, positions ascending); positions: int32 [N];
    window: 0 = full attention, else a key at position j is visible to a query at p only if
    p - j < window (sliding-window layers); softcap: 0 = none, else each score (q.k times scale)
    becomes softcap * tanh(score / softcap); sinks: float32 [n_heads] attention sinks (gpt-oss:
    a per-head logit with no value) or [0]; out: float32 [N, n_heads * head_dim]. Work items
    (query tile, kv-head) are dealt to the n_threads threads round-robin; when there are fewer
    of them than threads (decoding one sequence of a model with one kv-head), each query head
    is an item of its own.
    """
    N = q.shape[0]
    n_kv, hd = v_cache.shape[2], head_dim_of(v_cache, v_scale)
    n_rep = q.shape[1] // (n_kv * hd)
    longest = 1
    for t in range(N):
        longest = max(longest, positions[t] + 1)
    width = longest + 3 * LANES  # a tile's keys from its chunk-aligned first, and a chunk's 16 lanes past the last
    tile = max(1, min(QUERY_TILE, N, SCORE_BUDGET // (n_rep * width)))  # scratch sized for this call's tiles
    starts = _tiles(token_seq, N, tile)
    n_tiles = starts.shape[0] - 1
    # fewer (tile, kv-head) items than threads (decoding a model with one kv-head): query heads
    # become items of their own. Not to even out an uneven count: each item converts its keys
    # and values, and three kv-heads on two threads ran faster whole (smollm2's decode)
    split = n_rep if n_tiles * n_kv < n_threads else 1
    items = n_tiles * n_kv * split
    rows = tile * n_rep
    for tid in numba.prange(n_threads):
        sc = np.empty((rows, width), np.float32)
        acc = np.empty((rows, hd), np.float32)
        qh = np.empty(rows * hd, np.float32)
        inv_den = np.empty(rows, np.float32)
        kt = np.zeros(2 * LANES * hd, np.float32)
        ks = np.zeros(2 * LANES, np.float32)
        kv = np.empty((LANES, hd), np.float32)
        for it in range(tid, items, n_threads):
            ti, rest = it // (n_kv * split), it % (n_kv * split)
            g, part = rest // split, rest % split
            r0, r1 = part * n_rep // split, (part + 1) * n_rep // split
            t0 = starts[ti]
            _attend_tile(q, t0, starts[ti + 1], g, r0, r1, token_seq[t0], block_tables, k_cache, k_scale, v_cache,
                         v_scale, positions, scale, window, softcap, sinks, sc, qh, kt, ks, kv, acc, inv_den, out)
