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

from ._jit import kernel
from .dequant import decode_rows

ROW_GROUP = 4


@kernel(fastmath=True)
def _dot_group(wg, x, out, t, r0, nvalid):  # type: ignore[no-untyped-def]
    # Four independent accumulations sharing the loads of x; fastmath lets LLVM vectorize each
    # reduction in its own fixed lane order (the same for every call of this function).
    n = x.shape[1]
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    for k in range(n):
        xv = x[t, k]
        a0 += wg[0, k] * xv
        a1 += wg[1, k] * xv
        a2 += wg[2, k] * xv
        a3 += wg[3, k] * xv
    out[t, r0] = a0
    if nvalid > 1:
        out[t, r0 + 1] = a1
    if nvalid > 2:
        out[t, r0 + 2] = a2
    if nvalid > 3:
        out[t, r0 + 3] = a3


@kernel(parallel=True)
def matmul_kernel(x, w, qtype, out, n_threads):  # type: ignore[no-untyped-def]
    """x: float32 [T, K]; w: uint8 [R, row_bytes] in GGML type `qtype`; out: float32 [T, R];
    n_threads: the work is split into this many row ranges (numba's thread count)."""
    T, K = x.shape
    R = w.shape[0]
    n_groups = (R + ROW_GROUP - 1) // ROW_GROUP
    per = (n_groups + n_threads - 1) // n_threads
    for tid in numba.prange(n_threads):
        wg = np.empty((ROW_GROUP, K), np.float32)
        for g in range(tid * per, min(n_groups, (tid + 1) * per)):
            r0 = g * ROW_GROUP
            nvalid = min(ROW_GROUP, R - r0)
            for i in range(ROW_GROUP):
                # a short last group decodes its last row again; only valid rows are written
                decode_rows(qtype, w, r0 + min(i, nvalid - 1), wg, i)
            for t in range(T):
                _dot_group(wg, x, out, t, r0, nvalid)


@kernel(parallel=True)
def embed_rows_kernel(ids, w, qtype, out):  # type: ignore[no-untyped-def]
    """out[i] = decoded row ids[i] of w (token embedding lookup); ids: int32 [N]."""
    for i in numba.prange(ids.shape[0]):
        decode_rows(qtype, w, ids[i], out, i)
