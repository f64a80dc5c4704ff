"""Checks of the int8 matmul (kernels_cpu.matmul_i8), shared by its tests and the portable
subprocess runs (generic and AVX2 targets compile its plain-IR stand-in for vpdpbusd)."""

from __future__ import annotations

import numpy as np
from kernel_data import random_rows

from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import matmul_i8 as m8
from edge_infer.kernels_cpu import reference as ref


def prepare(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, ...]:
    rows, k = w.shape[0], x.shape[1]
    groups, nb = -(-rows // m8.GROUP), k // 32
    wi = np.zeros((groups, nb, 512), np.uint8)
    wd = np.zeros((groups, nb, m8.GROUP), np.float32)
    m8.repack_q8_0(w, wi, wd)
    t = x.shape[0]
    xq4 = np.empty((t, k // 4), np.int32)
    xd = np.empty((t, nb), np.float32)
    xsum = np.empty((t, nb), np.int32)
    m8.quantize_rows_q8(x, xq4, xd, xsum)
    return wi, wd, xq4, xd, xsum


def run(prep: tuple[np.ndarray, ...], rows: int, threads: int, t: slice | None = None) -> np.ndarray:
    wi, wd, xq4, xd, xsum = prep
    if t is not None:
        xq4, xd, xsum = xq4[t], xd[t], xsum[t]
    out = np.full((xq4.shape[0], rows), np.nan, np.float32)
    m8.matmul_i8_kernel(np.ascontiguousarray(xq4), np.ascontiguousarray(xd), np.ascontiguousarray(xsum),
                        wi, wd, out, threads)
    return out


def check_i8(rng: np.random.Generator) -> None:
    """Against the NumPy twin on the quantized activations, and batch/thread invariance."""
    rows, k = 37, 96  # rows not a multiple of the 16-row group
    w = random_rows(dq.Q8_0, rows, k, rng, edge=True)
    x = rng.standard_normal((5, k)).astype(np.float32)
    x[1] = 0.0  # an all-zero token: scale 0
    prep = prepare(w, x)
    xq = prep[2].view(np.int8).reshape(5, k).astype(np.float64)
    assert np.all(np.abs(xq) <= 127)
    xdeq = (xq.reshape(5, k // 32, 32) * prep[3][:, :, None]).reshape(5, k)
    assert np.all(np.abs(xdeq - x) <= np.abs(x).reshape(5, -1, 32).max(-1).repeat(32, -1) / 127 * 0.5 + 1e-7)
    np.testing.assert_array_equal(prep[4], xq.reshape(5, -1, 32).sum(-1).astype(np.int32))
    got = run(prep, rows, 2)
    want = xdeq @ ref.decode_rows(w, dq.Q8_0).astype(np.float64).T
    scale = np.abs(xdeq) @ np.abs(ref.decode_rows(w, dq.Q8_0).astype(np.float64)).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-6)
    assert np.all(got[1] == 0.0)
    for t in range(5):  # a token alone, with 1 or 3 threads, gives the identical row
        np.testing.assert_array_equal(run(prep, rows, 1, slice(t, t + 1))[0], got[t])
        np.testing.assert_array_equal(run(prep, rows, 3, slice(t, t + 1))[0], got[t])
