"""Grouped expert matmuls: every active expert's weights read once per step, for all the pairs
routed to it; experts with no pairs are not touched.

Input rows are pair-major and grouped by expert (kernels_cpu.moe: expert e's pairs are rows
offsets[e]..offsets[e + 1] - 1). Expert matrices are stacked along a leading expert axis, each
in the form its dense twin uses: K-quants in matmul_k's records (wk [E, G, S, B]), the 4/5/8-bit
types in matmul_i8's (wi [E, G, nb, bb], ...), anything else as GGUF blocks (w [E, R, row_bytes],
decoded by matmul's float path). Each expert's rows run through the dense kernels' per-group
code on its contiguous slice, so a pair's output equals that of a dense matmul of its token
with that expert's matrix, bit for bit, whatever else is in the step.

Work items are (expert, row group) of up to two matrices (gate and up; or down); threads take
contiguous runs of items of equal cost, an item costing its expert's pair count plus
ITEM_OVERHEAD (the weight read), so a prefill's popular experts are not one thread's alone.
"""

from __future__ import annotations

import numba
import numpy as np

from ._jit import kernel
from .matmul import ROW_GROUP, _row_groups
from .matmul_i8 import TOKEN_TILE, _i8_groups, quantize_rows_q8
from .matmul_k import _k_range
from .repack_i8 import I8Weights
from .repack_k import KWeights
from .simd_i8 import GROUP

ITEM_OVERHEAD = 4  # a row group's weight read, in pairs' worth of compute


@kernel(inline=True)
def _total_cost(offsets, n_items):
    total = 0
    for e in range(offsets.shape[0] - 1):
        cnt = offsets[e + 1] - offsets[e]
        if cnt > 0:
            total += n_items * (cnt + ITEM_OVERHEAD)
    return total


@kernel(inline=True)
def _ceil_div(a, b):
    return -(-a // b)


@kernel(inline=True)
def _thread_plan(offsets, n_items, n_threads, tid, plan):
    """Thread tid's share of the work: rows (e, j0, j1) of plan int64 [E, 3], expert e's items
    j0..j1-1, those whose cost start c_e + j * unit lies in the thread's equal slice of the total
    cost; returns how many rows."""
    total = _total_cost(offsets, n_items)
    lo, hi = total * tid // n_threads, total * (tid + 1) // n_threads
    c, rows = 0, 0
    for e in range(offsets.shape[0] - 1):
        cnt = offsets[e + 1] - offsets[e]
        if cnt == 0:
            continue
        unit = cnt + ITEM_OVERHEAD
        j0 = min(n_items, _ceil_div(max(lo - c, 0), unit))
        j1 = min(n_items, _ceil_div(max(hi - c, 0), unit))
        if j0 < j1:
            plan[rows, 0], plan[rows, 1], plan[rows, 2] = e, j0, j1
            rows += 1
        c += n_items * unit
    return rows


@kernel(parallel=True)
def expert_matmul2_k_kernel(x, xq4, xd, xs16, offsets, wka, qa, ba, ha, outa, wkb, qb, bb, hb, outb,
                            n_threads):
    """K-quant experts: x f32 [P, K] quantized into xq4/xd/xs16 (quantize_rows_q8, sums per
    16), then outa[p] = x[p] @ A[e].T and outb[p] = x[p] @ B[e].T for each pair p of expert e;
    wka, wkb uint8 [E, G, S, B] (wkb with zero groups: one matrix only), each with its type,
    code bits and header bytes as matmul_k_kernel takes them."""
    quantize_rows_q8(x, xq4, xd, xs16)
    ga, gb = wka.shape[1], wkb.shape[1]
    for tid in numba.prange(n_threads):
        plan = np.empty((offsets.shape[0] - 1, 3), np.int64)
        for i in range(_thread_plan(offsets, ga + gb, n_threads, tid, plan)):
            e, j0, j1 = plan[i, 0], plan[i, 1], plan[i, 2]
            o0, o1 = offsets[e], offsets[e + 1]
            if j0 < min(j1, ga):
                _k_range(xq4[o0:o1], xd[o0:o1], xs16[o0:o1], wka[e], qa, ba, ha, outa[o0:o1], j0, min(j1, ga))
            if j1 > ga:
                _k_range(xq4[o0:o1], xd[o0:o1], xs16[o0:o1], wkb[e], qb, bb, hb, outb[o0:o1],
                         max(j0, ga) - ga, j1 - ga)


@kernel(parallel=True)
def expert_matmul2_i8_kernel(x, xq4, xd, xsum, offsets, wia, wda, wma, offa, fa, outa, wib, wdb, wmb, offb, fb,
                             outb, n_threads):
    """4/5/8-bit experts: as expert_matmul2_k_kernel with matmul_i8's layout per expert (wi
    uint8 [E, G, nb, bb], wd uint16 [E, G, nb, 16], wm uint16 [E, G, nb, 16] or [E, 0, 0, 0],
    off the u8 code of zero, f the format) and its activations (sums per 32)."""
    quantize_rows_q8(x, xq4, xd, xsum)
    ga, gb = wia.shape[1], wib.shape[1]
    for tid in numba.prange(n_threads):
        iacc = np.zeros(TOKEN_TILE * GROUP, np.int32)
        facc = np.zeros((2 * TOKEN_TILE, GROUP), np.float32)  # _i8_groups: a pair's two groups
        plan = np.empty((offsets.shape[0] - 1, 3), np.int64)
        for i in range(_thread_plan(offsets, ga + gb, n_threads, tid, plan)):
            e, j0, j1 = plan[i, 0], plan[i, 1], plan[i, 2]
            o0, o1 = offsets[e], offsets[e + 1]
            if j0 < min(j1, ga):
                _i8_groups(xq4[o0:o1], xd[o0:o1], xsum[o0:o1], wia[e], wda[e], wma[e], offa, fa, outa[o0:o1],
                           j0, min(j1, ga), iacc, facc)
            if j1 > ga:
                _i8_groups(xq4[o0:o1], xd[o0:o1], xsum[o0:o1], wib[e], wdb[e], wmb[e], offb, fb, outb[o0:o1],
                           max(j0, ga) - ga, j1 - ga, iacc, facc)


@kernel(parallel=True)
def expert_matmul2_kernel(x, offsets, wa, qa, outa, wb, qb, outb, n_threads):
    """Experts of any other type, on matmul's float path: wa, wb uint8 [E, R, row_bytes] GGUF
    blocks of GGML type qa, qb (wb with zero rows: one matrix only); x f32 [P, K]."""
    ga = (wa.shape[1] + ROW_GROUP - 1) // ROW_GROUP
    gb = (wb.shape[1] + ROW_GROUP - 1) // ROW_GROUP
    for tid in numba.prange(n_threads):
        wg = np.zeros((2 * ROW_GROUP, x.shape[1]), np.float32)
        plan = np.empty((offsets.shape[0] - 1, 3), np.int64)
        for i in range(_thread_plan(offsets, ga + gb, n_threads, tid, plan)):
            e, j0, j1 = plan[i, 0], plan[i, 1], plan[i, 2]
            o0, o1 = offsets[e], offsets[e + 1]
            if j0 < min(j1, ga):
                _row_groups(x[o0:o1], wa[e], qa, outa[o0:o1], j0, min(j1, ga), wg)
            if j1 > ga:
                _row_groups(x[o0:o1], wb[e], qb, outb[o0:o1], max(j0, ga) - ga, j1 - ga, wg)


def stack_experts(packed: I8Weights | KWeights, n_exp: int) -> I8Weights | KWeights:
    """A repacked [E * R]-row matrix viewed with a leading expert axis (groups never straddle)."""
    if isinstance(packed, KWeights):
        return KWeights(packed.wk.reshape(n_exp, -1, *packed.wk.shape[1:]), packed.qtype)
    wi, wd, wm = packed.wi, packed.wd, packed.wm
    wm = wm.reshape(n_exp, -1, *wm.shape[1:]) if wm.size else np.empty((n_exp, 0, 0, 0), np.uint16)
    return I8Weights(wi.reshape(n_exp, -1, *wi.shape[1:]), wd.reshape(n_exp, -1, *wd.shape[1:]), wm, packed.offset,
                      packed.fmt)
