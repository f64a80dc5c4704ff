"""Checks of the int8 matmul (kernels_cpu.matmul_i8), shared by its tests and the portable
subprocess runs (the generic target compiles its plain-IR stand-in for vpdpbusd, the AVX2 one
vpmaddubsw)."""

from __future__ import annotations

import numpy as np
from kernel_data import random_rows

from edge_infer.formats.weight_types import TYPES
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import matmul_i8 as m8
from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.backend import quantize_rows
from edge_infer.kernels_cpu.repack_i8 import I8Weights, repack

I8_TYPES = tuple(t.id for t in TYPES if t.i8 is not None)


def prepare(w: np.ndarray, x: np.ndarray, qtype: int = dq.Q8_0) -> tuple:
    return (repack(w, qtype, w.shape[0], x.shape[1]), *quantize_rows(x))


def run(prep: tuple, rows: int, threads: int, t: slice | None = None) -> np.ndarray:
    iw: I8Weights
    iw, xq4, xd, xsum = prep
    if t is not None:
        xq4, xd, xsum = xq4[t], xd[t], xsum[t]
    out = np.full((xq4.shape[0], rows), np.nan, np.float32)
    m8.matmul_i8_kernel(np.ascontiguousarray(xq4), np.ascontiguousarray(xd), np.ascontiguousarray(xsum),
                        *iw.args, out, threads)
    return out


def check_i8(rng: np.random.Generator) -> None:
    """Per format: bit-exact against the NumPy twin of the integer arithmetic, close to the
    float64 product of the dequantized weights, and batch/thread invariant."""
    rows, k, n = 37, 96, 7  # rows not a multiple of the 16-row group; 7 tokens: a tile of 4 + a padded tile of 3
    for qtype in I8_TYPES:
        w = random_rows(qtype, rows, k, rng, edge=qtype == dq.Q8_0)
        x = rng.standard_normal((n, k)).astype(np.float32)
        x[1] = 0.0  # an all-zero token: scale 0
        prep = prepare(w, x, qtype)
        xq = prep[1].view(np.int8).reshape(n, k)
        assert np.all(np.abs(xq.astype(np.int64)) <= 127)
        xdeq = (xq.astype(np.float64).reshape(n, k // 32, 32) * prep[2][:, :, None]).reshape(n, k)
        bound = np.abs(x).reshape(n, -1, 32).max(-1).repeat(32, -1) / 127 * 0.5 + 1e-7
        assert np.all(np.abs(xdeq - x) <= bound)
        np.testing.assert_array_equal(prep[3], xq.astype(np.int64).reshape(n, -1, 32).sum(-1))
        got = run(prep, rows, 2)
        np.testing.assert_array_equal(got, ref.matmul_i8(xq, prep[2], prep[3], w, qtype), err_msg=f"twin {qtype}")
        dense = ref.decode_rows(w, qtype).astype(np.float64)
        scale = np.abs(xdeq) @ np.abs(dense).T
        assert np.all(np.abs(got - xdeq @ dense.T) <= 1e-5 * scale + 1e-6), qtype
        assert np.all(got[1] == 0.0)
        for t0, m in ((0, 3), (3, 3), (0, 2), (1, 6)):  # tiles of 3 (padded to four), of 2, of 4 + 2
            np.testing.assert_array_equal(run(prep, rows, 2, slice(t0, t0 + m)), got[t0 : t0 + m])
        # one thread: its GEMM runs groups 0 and 1 as a pair (kernels_cpu.simd_tile.i8_pair_tile), group 2 alone
        np.testing.assert_array_equal(run(prep, rows, 1), got)
        for t in range(n):  # a token alone, with 1 or 3 threads, gives the identical row
            np.testing.assert_array_equal(run(prep, rows, 1, slice(t, t + 1))[0], got[t])
            np.testing.assert_array_equal(run(prep, rows, 3, slice(t, t + 1))[0], got[t])
