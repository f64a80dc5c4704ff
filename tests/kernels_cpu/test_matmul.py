"""Quantized matmul against its NumPy twin, and batch invariance: GEMV and GEMM rows are
bit-identical, whatever the batch, the row's position and the thread count."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from kernel_data import random_rows

from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.matmul import embed_rows_kernel, matmul3_kernel, matmul_kernel


def run(x: np.ndarray, w: np.ndarray, qtype: int, threads: int = 2) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    matmul_kernel(x, w, qtype, out, threads)
    return out


@pytest.mark.parametrize("qtype", dq.KERNEL_TYPES)
@pytest.mark.parametrize(("rows", "tokens"), [(13, 1), (6, 5)])
def test_matmul_matches_reference(qtype: int, rows: int, tokens: int) -> None:
    rng = np.random.default_rng(1000 + qtype)
    cols = 512 if dq.BLOCK_SHAPE[qtype][0] == 256 else 96
    w = random_rows(qtype, rows, cols, rng, edge=False)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    got, want = run(x, w, qtype), ref.matmul(x, w, qtype)
    scale = np.abs(x).astype(np.float64) @ np.abs(ref.decode_rows(w, qtype)).astype(np.float64).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-6)


@pytest.mark.parametrize("qtype", [dq.Q4_1, dq.Q8_0, dq.Q5_0, dq.Q4_K, dq.Q6_K, dq.F32])
def test_rows_are_batch_and_thread_invariant(qtype: int) -> None:
    rng = np.random.default_rng(7)
    cols = 512 if dq.BLOCK_SHAPE[qtype][0] == 256 else 160
    w = random_rows(qtype, 23, cols, rng, edge=False)  # 23: not a multiple of the row group
    x = rng.standard_normal((9, cols)).astype(np.float32)
    batch = run(x, w, qtype, threads=2)
    for t in range(x.shape[0]):
        alone = run(x[t : t + 1], w, qtype, threads=1)
        np.testing.assert_array_equal(alone[0], batch[t])
    shuffled = run(np.ascontiguousarray(x[::-1]), w, qtype, threads=min(2, numba.config.NUMBA_NUM_THREADS))
    np.testing.assert_array_equal(shuffled[::-1], batch)
    odd = run(x, w, qtype, threads=3)  # more ranges than cores, uneven split
    np.testing.assert_array_equal(odd, batch)


def test_embedding_rows_decode_exactly() -> None:
    rng = np.random.default_rng(3)
    w = random_rows(dq.Q8_0, 50, 64, rng)
    ids = np.array([0, 49, 7, 7], np.int32)
    out = np.empty((4, 64), np.float32)
    embed_rows_kernel(ids, w, dq.Q8_0, out)
    np.testing.assert_array_equal(out, ref.decode_rows(w, dq.Q8_0)[ids])


@pytest.mark.slow
def test_real_tensors_of_every_type(smollm2_path, gemma3_path, qwen2_path) -> None:  # type: ignore[no-untyped-def]
    """One real matrix per weight type of the three models, against the NumPy twin."""
    rng = np.random.default_rng(5)
    seen: set[int] = set()
    for path in (smollm2_path, gemma3_path, qwen2_path):
        with GGUFFile(path) as f:
            for t in f.tensors.values():
                q = int(t.type)
                if len(t.shape) != 2 or q in seen or q not in dq.KERNEL_TYPES:
                    continue
                seen.add(q)
                rows = min(t.shape[1], 64)
                w = t.data.reshape(t.shape[1], -1)[:rows]
                x = rng.standard_normal((3, t.shape[0])).astype(np.float32)
                got, want = run(x, w, q), ref.matmul(x, w, q)
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert {dq.Q4_1, dq.Q8_0, dq.Q5_0, dq.Q4_K, dq.Q6_K} <= seen


def test_fused_matmuls_equal_separate_ones() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 96)).astype(np.float32)
    ws = [(random_rows(q, r, 96, rng, edge=False), q) for q, r in ((dq.Q5_0, 17), (dq.Q8_0, 6), (dq.Q4_1, 9))]
    outs = [np.full((3, w.shape[0]), np.nan, np.float32) for w, _ in ws]
    args = [a for (w, q), o in zip(ws, outs) for a in (w, q, o)]
    for threads in (1, 2, 5):
        matmul3_kernel(x, *args, threads)
        for (w, q), o in zip(ws, outs):
            np.testing.assert_array_equal(o, run(x, w, q))
    empty = np.empty((3, 0), np.float32)
    matmul3_kernel(x, ws[0][0], ws[0][1], outs[0], np.empty((0, 1), np.uint8), 0, empty, ws[2][0], ws[2][1], outs[2], 2)
    np.testing.assert_array_equal(outs[2], run(x, *ws[2]))
