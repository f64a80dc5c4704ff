"""Memory read bandwidth as numba's threads see it: what a GEMV, which reads every weight byte
once, can reach at best. Used by the benchmarks to state decode's limit."""

from __future__ import annotations

import time

import numba
import numpy as np

from ._jit import REORDER, kernel


@kernel(fastmath=REORDER)
def _chunk_sum(a):
    s = np.float32(0.0)
    for i in range(a.shape[0]):  # from 0: numba's negative-index wrap-around folds away
        s += a[i]
    return s


@kernel(parallel=True)
def sum_kernel(a, n_threads):
    """Sum of float32 a, each of n_threads summing one contiguous slice (a streamed read).
    The loop is a function of its own over a slice: `for i in range(lo, hi)` in the prange body
    compiles to gathers (numba wraps possibly negative indices) at a third of the speed."""
    per = (a.shape[0] + n_threads - 1) // n_threads
    part = np.zeros(n_threads, np.float64)
    for t in numba.prange(n_threads):
        part[t] = _chunk_sum(a[t * per : min(a.shape[0], (t + 1) * per)])
    return part.sum()


def read_bandwidth_gbps(n_threads: int, nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Best of `repeats` streamed reads of an nbytes float32 array (larger than the last-level
    cache), with n_threads threads, in GB/s (1e9 bytes). The best, not the median: the machine's
    other load only ever lowers it."""
    numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
    a = np.ones(nbytes // 4, np.float32)
    sum_kernel(a, n_threads)  # compile or load, and fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        sum_kernel(a, n_threads)
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9
