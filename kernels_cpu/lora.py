"""LoRA's low-rank update beside a matmul: out[t] += s * B (A x[t]) for each adapter a row uses
(llama.cpp's build_lora_mm: the base product, then each adapter's B (A x) scaled and added).

One launch serves every adapter of a step for one base matrix [R, K] (vLLM's punica idea): the
loaded adapters' A matrices for it are stacked into a [sum of ranks, K] array and their B's,
transposed, into [sum of ranks, R], float32 or IEEE half bits (uint16: F16 adapter files);
adapter i's rows start at tab_off[i] and number tab_rank[i] (0: it leaves this matrix alone).
Row t's adapters are entries row_ptr[t] .. row_ptr[t+1]-1 of ent_adapter (slots, ascending)
and ent_scale (the request's adapter scale). The scale applied is llama.cpp's: times alpha /
rank (tab_alpha[i]; alpha 0: the request's scale alone), in float32 and that order.

Each row's update is computed whole by one thread in a fixed order (A x into rank values, then
B^T's rows accumulated over the whole output row, then scaled and added), so a row's result
never depends on the batch; rows are split over the threads. (Splitting one row's output
columns over the threads instead ran several times slower here.)
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import overload

from ._jit import REORDER, f16_to_f32, fmadd, kernel


def weight_at(w, i, k):
    """w[i, k] as float32: w float32, or uint16 IEEE half bits (overloaded by dtype)."""


@overload(weight_at, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _weight_at(w, i, k):
    if isinstance(w.dtype, types.Integer):
        return lambda w, i, k: f16_to_f32(w[i, k])
    return lambda w, i, k: w[i, k]


@kernel(fastmath=REORDER)
def _lora_rows(x, row_ptr, ent_adapter, ent_scale, tab_off, tab_rank, tab_alpha, a, bt, out, t0, t1, tvec, acc):
    """Rows t0 .. t1 - 1; tvec float32 [>= max rank], acc float32 [R]: scratch."""
    k_dim, r_dim = x.shape[1], out.shape[1]
    for t in range(t0, t1):
        for e in range(row_ptr[t], row_ptr[t + 1]):
            i = ent_adapter[e]
            off, rank, alpha = tab_off[i], tab_rank[i], tab_alpha[i]
            if rank == 0:
                continue
            for j in range(rank):
                s = np.float32(0.0)
                for k in range(k_dim):
                    s = fmadd(x[t, k], weight_at(a, off + j, k), s)
                tvec[j] = s
            for o in range(r_dim):
                acc[o] = np.float32(0.0)
            for j in range(rank):
                tj = tvec[j]
                for o in range(r_dim):
                    acc[o] = fmadd(weight_at(bt, off + j, o), tj, acc[o])
            scale = ent_scale[e]
            if alpha != 0:  # llama.cpp's get_scale
                scale = scale * alpha / np.float32(rank)
            for o in range(r_dim):
                out[t, o] += np.float32(scale * acc[o])


@kernel
def lora_serial_kernel(x, row_ptr, ent_adapter, ent_scale, tab_off, tab_rank, tab_alpha, a, bt, out):
    """x float32 [T, K]; row_ptr int32 [T + 1]; ent_adapter int32 [E]; ent_scale float32 [E];
    tab_off, tab_rank int32 [slots]; tab_alpha float32 [slots]; a [sum of ranks, K], bt [sum of
    ranks, R] (float32 or uint16 half bits); out float32 [T, R], added to. On the calling thread."""
    tvec = np.empty(max(1, tab_rank.max()), np.float32)
    acc = np.empty(out.shape[1], np.float32)
    _lora_rows(x, row_ptr, ent_adapter, ent_scale, tab_off, tab_rank, tab_alpha, a, bt, out, 0, x.shape[0], tvec,
               acc)


@kernel(parallel=True)
def lora_kernel(x, row_ptr, ent_adapter, ent_scale, tab_off, tab_rank, tab_alpha, a, bt, out, n_threads):
    """lora_serial_kernel with the rows split over n_threads by their number of updates (the
    same per-row code)."""
    n_ent = ent_adapter.shape[0]
    per = (n_ent + n_threads - 1) // n_threads
    starts = row_ptr[:-1]
    for tid in numba.prange(n_threads):
        tvec = np.empty(max(1, tab_rank.max()), np.float32)
        acc = np.empty(out.shape[1], np.float32)
        t0 = np.searchsorted(starts, min(n_ent, tid * per))  # the rows whose first update is in this share
        t1 = np.searchsorted(starts, min(n_ent, (tid + 1) * per)) if tid + 1 < n_threads else x.shape[0]
        _lora_rows(x, row_ptr, ent_adapter, ent_scale, tab_off, tab_rank, tab_alpha, a, bt, out, t0, t1, tvec, acc)
