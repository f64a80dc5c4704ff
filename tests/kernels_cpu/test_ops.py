"""Per-row kernels (norms, RoPE, activations, adds) against their NumPy twins."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu import ops
from edge_infer.kernels_cpu import reference as ref

RNG = np.random.default_rng(11)


def close(a: np.ndarray, b: np.ndarray, tol: float = 2e-6) -> None:
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("shape", [(1, 64), (5, 576), (3, 7)])
def test_rmsnorm_and_fused_residual(shape: tuple[int, int]) -> None:
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    d = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal(shape[1]).astype(np.float32)
    out = np.empty_like(x)
    ops.rmsnorm_kernel(x, w, np.float32(1e-6), out)
    close(out, ref.rmsnorm(x, w, 1e-6))
    h = x.copy()
    ops.add_rmsnorm_kernel(h, d, w, np.float32(1e-6), out)
    np.testing.assert_array_equal(h, x + d)
    close(out, ref.rmsnorm(x + d, w, 1e-6))


def test_zero_rows_stay_finite() -> None:
    x = np.zeros((2, 16), np.float32)
    out = np.empty_like(x)
    ops.rmsnorm_kernel(x, np.ones(16, np.float32), np.float32(1e-5), out)
    assert np.all(out == 0)


def test_gated_activations() -> None:
    g = RNG.standard_normal((3, 100)).astype(np.float32) * 4
    u = RNG.standard_normal((3, 100)).astype(np.float32)
    out = np.empty_like(g)
    ops.silu_mul_kernel(g, u, out)
    close(out, ref.silu_mul(g, u), 1e-5)
    ops.gelu_mul_kernel(g, u, out)
    close(out, ref.gelu_mul(g, u), 1e-5)
    for args in ((1.3, 2.0, 0.5, -1e-6), (0.2, 0.7, -0.3, 0.5)):  # apertus's xIELU (eps > 0 takes the expm1 branch's cap)
        ops.xielu_kernel(g, *(np.float32(a) for a in args), out)
        close(out, ref.xielu(g, *(float(np.float32(a)) for a in args)), 1e-5)
    ops.swiglu_oai_kernel(g, u * 4, out)  # gpt-oss's clamped SwiGLU (both clamps bite at |x| > 7)
    close(out, ref.swiglu_oai(g, u * 4), 1e-5)
    ops.relu_mul_kernel(g, u, out)  # smallthinker's ReGLU experts
    close(out, ref.relu_mul(g, u), 1e-6)
    ops.relu_sqr_kernel(g, out)  # nemotron_h's ungated FFN
    close(out, ref.relu_sqr(g), 1e-6)
    assert (out[g < 0] == 0).all()
    big = np.tile(g, (40, 1))  # the parallel path: every row as alone
    out_big = np.empty_like(big)
    ops.relu_sqr_kernel(big, out_big)
    np.testing.assert_array_equal(out_big[:3], out)


def test_scale() -> None:
    x = RNG.standard_normal((3, 10)).astype(np.float32)
    z = x.copy()
    ops.scale_kernel(z, np.float32(2.0))
    np.testing.assert_array_equal(z, x * np.float32(2.0))
