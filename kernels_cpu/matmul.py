"""Quantized matmul on GGUF blocks: out[t, r] = sum_k x[t, k] * W[r, k].

W stays in its file layout (uint8 [rows, row_bytes], a view of the mmap). Rows are decoded in
groups of ROW_GROUP into a small float32 scratch (L1-resident) and each decoded group is reused
for every token of the batch: one pass over the weights per call, whatever the batch size.

Batch invariance: out[t, r] depends only on x[t] and W's row group (fixed by r): the same
`_dot_group` loop with the same accumulation order runs for every row, token, batch size and
thread count. Threads split row groups, never the reduction, so GEMV (T=1) rows are
bit-identical to GEMM rows.
"""

from __future__ import annotations

import numba
import numpy as np

from ._jit import REORDER, fmadd, kernel, prefetch
from .dequant import decode_rows

ROW_GROUP = 4


@kernel(inline=True)
def _dot_group(wg, x, out, t0, t1, r0, nvalid):
    """Rows r0.. (decoded in wg) times tokens t0 and t1: eight independent accumulations, each
    row load shared by two tokens and each token load by four rows (enough to keep both FMA
    units busy). Inlined into _row_groups, whose fastmath flags (REORDER) let LLVM vectorize
    the reductions, all in the same fixed lane order, whatever the batch size or the token's place
    in it."""
    n = x.shape[1]
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    b0 = np.float32(0.0)
    b1 = np.float32(0.0)
    b2 = np.float32(0.0)
    b3 = np.float32(0.0)
    for k in range(n):
        xa = x[t0, k]
        xb = x[t1, k]
        w0, w1, w2, w3 = wg[0, k], wg[1, k], wg[2, k], wg[3, k]
        a0 = fmadd(w0, xa, a0)
        a1 = fmadd(w1, xa, a1)
        a2 = fmadd(w2, xa, a2)
        a3 = fmadd(w3, xa, a3)
        b0 = fmadd(w0, xb, b0)
        b1 = fmadd(w1, xb, b1)
        b2 = fmadd(w2, xb, b2)
        b3 = fmadd(w3, xb, b3)
    out[t0, r0] = a0
    out[t1, r0] = b0
    if nvalid > 1:
        out[t0, r0 + 1] = a1
        out[t1, r0 + 1] = b1
    if nvalid > 2:
        out[t0, r0 + 2] = a2
        out[t1, r0 + 2] = b2
    if nvalid > 3:
        out[t0, r0 + 3] = a3
        out[t1, r0 + 3] = b3


@kernel(inline=True)
def _dot_rows8(wg, x, out, t, r0, nv0, r1, nv1):
    """GEMV form of _dot_group: eight rows (two decoded row groups, at r0 and r1) times one
    token. Each accumulator sees the very same sequence of products as in _dot_group (and the
    loop has the same shape: eight accumulations, two-operand products), so LLVM vectorizes
    both alike and a GEMV row equals the GEMM row bit for bit (the tests hold it to that); no
    multiply-adds are spent on a duplicated token."""
    n = x.shape[1]
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    b0 = np.float32(0.0)
    b1 = np.float32(0.0)
    b2 = np.float32(0.0)
    b3 = np.float32(0.0)
    for k in range(n):
        xa = x[t, k]
        a0 = fmadd(wg[0, k], xa, a0)
        a1 = fmadd(wg[1, k], xa, a1)
        a2 = fmadd(wg[2, k], xa, a2)
        a3 = fmadd(wg[3, k], xa, a3)
        b0 = fmadd(wg[4, k], xa, b0)
        b1 = fmadd(wg[5, k], xa, b1)
        b2 = fmadd(wg[6, k], xa, b2)
        b3 = fmadd(wg[7, k], xa, b3)
    out[t, r0] = a0
    if nv0 > 1:
        out[t, r0 + 1] = a1
    if nv0 > 2:
        out[t, r0 + 2] = a2
    if nv0 > 3:
        out[t, r0 + 3] = a3
    if nv1 > 0:
        out[t, r1] = b0
    if nv1 > 1:
        out[t, r1 + 1] = b1
    if nv1 > 2:
        out[t, r1 + 2] = b2
    if nv1 > 3:
        out[t, r1 + 3] = b3


@kernel(inline=True)
def _decode_group(qtype, w, r0, nvalid, wg, at):
    """Rows r0..r0+ROW_GROUP-1 of w into wg[at:at+ROW_GROUP]; a short last group (nvalid rows)
    decodes its last row again, and only valid rows are ever written out."""
    for i in range(ROW_GROUP):
        decode_rows(qtype, w, r0 + min(i, nvalid - 1), wg, at + i)


# GEMM: the rows this many row groups ahead are prefetched, a slice per token, while a decoded
# pair is multiplied, so memory keeps streaming during the multiply-adds (F16, T=9, matrices
# streamed from memory: 266 -> 231 us per 1536 x 576 matrix on the 2-core VM)
PREFETCH_GROUPS = 8
TILE_BYTES = 512 * 1024  # activations of one token tile stay in L2 while a row group meets them


@kernel(inline=True)
def _prefetch_span(w, lo, hi):
    for at in range(lo, hi, 64):
        prefetch(w, at)


@kernel(fastmath=REORDER)
def _row_groups(x, w, qtype, out, g0, g1, wg):
    """Row groups g0..g1-1 of one matrix for every token of x. Tokens go in tiles whose
    activations fit in L2: each row group is decoded once per tile (a large batch would
    otherwise stream all of x from memory for every row group). Row groups go in pairs, so a
    tile's odd last token takes the GEMV form (_dot_rows8, bit-identical to _dot_group) instead
    of being paired with a duplicate of itself."""
    R, T, K = w.shape[0], x.shape[0], x.shape[1]
    tile = max(2, min(T, TILE_BYTES // (4 * K)))
    tile += tile & 1
    for t0 in range(0, T, tile):
        t1 = min(T, t0 + tile)
        odd = (t1 - t0) & 1  # the tile's last token, when alone, goes through the GEMV form
        for g in range(g0, g1, 2):
            r0 = g * ROW_GROUP
            nv0 = min(ROW_GROUP, R - r0)
            nv1 = min(ROW_GROUP, R - r0 - ROW_GROUP) if g + 1 < g1 else 0
            pf_lo = (r0 + PREFETCH_GROUPS * ROW_GROUP) * w.shape[1]
            pf_hi = min(R, r0 + (PREFETCH_GROUPS + 2) * ROW_GROUP) * w.shape[1]
            per_token = 64 * -(-(pf_hi - pf_lo) // (64 * (t1 - t0))) if T > 1 and t0 == 0 else 0
            _decode_group(qtype, w, r0, nv0, wg, 0)
            if nv1 > 0:  # else the second half of wg is computed on but never written out
                _decode_group(qtype, w, r0 + ROW_GROUP, nv1, wg, ROW_GROUP)
            for t in range(t0, t1 - odd, 2):
                _prefetch_span(w, pf_lo + (t - t0) * per_token, min(pf_hi, pf_lo + (t - t0 + 2) * per_token))
                _dot_group(wg, x, out, t, t + 1, r0, nv0)
                if nv1 > 0:
                    _dot_group(wg[ROW_GROUP:], x, out, t, t + 1, r0 + ROW_GROUP, nv1)
            if odd:
                _prefetch_span(w, pf_lo + (t1 - 1 - t0) * per_token, pf_hi if per_token else 0)
                _dot_rows8(wg, x, out, t1 - 1, r0, nv0, r0 + ROW_GROUP, nv1)


@kernel(inline=True)
def _groups(w):
    return (w.shape[0] + ROW_GROUP - 1) // ROW_GROUP


@kernel(parallel=True)
def matmul3_kernel(x, wa, qa, oa, wb, qb, ob, wc, qc, oc, n_threads):
    """Up to three matmuls of the same input in one parallel launch (Q, K and V; gate and up):
    out_m[t, r] = sum_k x[t, k] * W_m[r, k]. A matrix with zero rows is skipped. The row groups
    of all three are split evenly over n_threads; each output is computed exactly as by
    matmul_kernel (the same per-group code), so fusing changes no result."""
    K = x.shape[1]
    na, nb, nc = _groups(wa), _groups(wb), _groups(wc)
    total = na + nb + nc
    per = (total + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        wg = np.zeros((2 * ROW_GROUP, K), np.float32)
        lo, hi = tid * per, min(total, (tid + 1) * per)
        if lo < na:
            _row_groups(x, wa, qa, oa, lo, min(hi, na), wg)
        if hi > na and lo < na + nb:
            _row_groups(x, wb, qb, ob, max(lo, na) - na, min(hi, na + nb) - na, wg)
        if hi > na + nb:
            _row_groups(x, wc, qc, oc, max(lo, na + nb) - na - nb, hi - na - nb, wg)


@kernel(parallel=True)
def matmul_kernel(x, w, qtype, out, n_threads):
    """x: float32 [T, K]; w: uint8 [R, row_bytes] in GGML type `qtype`; out: float32 [T, R];
    n_threads: the work is split into this many row ranges (numba's thread count)."""
    n_groups = _groups(w)
    per = (n_groups + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        wg = np.zeros((2 * ROW_GROUP, x.shape[1]), np.float32)
        _row_groups(x, w, qtype, out, tid * per, min(n_groups, (tid + 1) * per), wg)


@kernel(parallel=True)
def embed_rows_kernel(ids, w, qtype, out):
    """out[i] = decoded row ids[i] of w (token embedding lookup); ids: int32 [N]."""
    for i in numba.prange(ids.shape[0]):
        decode_rows(qtype, w, ids[i], out, i)
