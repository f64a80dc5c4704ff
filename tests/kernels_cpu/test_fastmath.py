"""The vectorizable exp/tanh/activations against numpy in float64."""

from __future__ import annotations

import numpy as np

from edge_infer.kernels_cpu._jit import kernel
from edge_infer.kernels_cpu.fastmath import fast_exp, fast_tanh, gelu_tanh, silu


@kernel
def _apply(kind, x, out):  # type: ignore[no-untyped-def]
    for i in range(x.shape[0]):
        if kind == 0:
            out[i] = fast_exp(x[i])
        elif kind == 1:
            out[i] = fast_tanh(x[i])
        elif kind == 2:
            out[i] = silu(x[i])
        else:
            out[i] = gelu_tanh(x[i])


def run(kind: int, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    _apply(kind, x, out)
    return out


def test_fast_exp_relative_error() -> None:
    x = np.concatenate([np.linspace(-87, 88, 200001), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    rel = np.abs(run(0, x) - ref) / ref
    assert rel.max() < 1.5e-7
    assert run(0, np.array([-100.0, -88.0], np.float32)).max() < 2e-38
    assert np.isfinite(run(0, np.array([100.0], np.float32))[0])


def test_tanh_and_activations() -> None:
    x = np.linspace(-30, 30, 100001).astype(np.float32)
    x64 = x.astype(np.float64)
    assert np.abs(run(1, x) - np.tanh(x64)).max() < 3e-7
    np.testing.assert_allclose(run(2, x), x64 / (1 + np.exp(-x64)), rtol=1e-6, atol=1e-7)
    gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    np.testing.assert_allclose(run(3, x), gelu, rtol=1e-6, atol=1e-6)
