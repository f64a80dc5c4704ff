"""The vision towers' products split over a pool (models/vision_blas.py): the same values as
one NumPy product, F16 and BF16 widened exactly, BLAS held to one thread inside the block."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models.vision_blas import VisionBlas


@pytest.fixture(scope="module")
def blas():  # type: ignore[no-untyped-def]
    b = VisionBlas(CpuBackend(2), 2)
    yield b
    b.close()


def test_row_split_product_is_the_whole_product(blas: VisionBlas) -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((37, 24), np.float32), rng.standard_normal((19, 24), np.float32)
    out = np.full((37, 19), np.nan, np.float32)
    blas.matmul(x, w.T, out)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("budget", [None, 33 * 7])  # all 33 queries at once; blocks of 7 (the last 5)
def test_attention_matches_softmax_per_head(blas: VisionBlas, budget: int | None) -> None:
    rng = np.random.default_rng(1)
    n, heads, hd = 33, 3, 8
    q, k, v = (rng.standard_normal((n, heads * hd), np.float32) for _ in range(3))
    out = np.full((n, heads * hd), np.nan, np.float32)
    if budget is None:
        blas.attention(q, k, v, out, heads, hd)
    else:
        small = VisionBlas(CpuBackend(2), 2, score_budget=budget)
        small.attention(q, k, v, out, heads, hd)
        small.close()
    for h in range(heads):
        c = slice(h * hd, (h + 1) * hd)
        s = q[:, c].astype(np.float64) @ k[:, c].T.astype(np.float64)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        np.testing.assert_allclose(out[:, c], (p / p.sum(axis=1, keepdims=True)) @ v[:, c], rtol=1e-4, atol=1e-5)


def test_widened_f16_and_bf16_are_exact(blas: VisionBlas) -> None:
    from edge_infer.formats.qmatrix import QMatrix

    rng = np.random.default_rng(2)
    f16 = rng.standard_normal((9, 5)).astype(np.float16)
    got = blas.widened(QMatrix("w", f16.view(np.uint8).reshape(9, -1), 1, 9, 5))
    np.testing.assert_array_equal(got, f16.astype(np.float32))
    bf16 = (rng.standard_normal((9, 5)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    got = blas.widened(QMatrix("w", bf16.view(np.uint8).reshape(9, -1), 30, 9, 5))
    np.testing.assert_array_equal(got.view(np.uint32), bf16.astype(np.uint32) << 16)


def test_blas_is_held_to_one_thread_inside_the_block(blas: VisionBlas) -> None:
    from threadpoolctl import threadpool_info

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    if not blas_threads():
        pytest.skip("NumPy's BLAS is not one threadpoolctl knows")
    before = blas_threads()
    with blas.one_thread_each():
        assert set(blas_threads()) == {1}
    assert blas_threads() == before
