"""The int8 (VNNI) matmul used for Q8_0 output matrices: exact against its twin on quantized
activations, batch- and thread-invariant, and close to the float matmul on real tensors."""

from __future__ import annotations

import numpy as np
import pytest
from check_i8 import check_i8, prepare, run

from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import reference as ref


def test_int8_matmul_against_twin_and_invariance() -> None:
    check_i8(np.random.default_rng(21))


@pytest.mark.slow
def test_real_output_matrix_close_to_float(gemma3_path) -> None:  # type: ignore[no-untyped-def]
    """gemma3's tied 262k x 640 Q8_0 output (first 2048 rows): int8 activations change the
    logits only by the activation rounding (a few percent of their spread at worst)."""
    with GGUFFile(gemma3_path) as f:
        t = f.tensors["token_embd.weight"]
        w = np.ascontiguousarray(t.data.reshape(t.shape[1], -1)[:2048])
        x = np.random.default_rng(3).standard_normal((3, t.shape[0])).astype(np.float32)
        got = run(prepare(w, x), w.shape[0], 2)
        exact = x.astype(np.float64) @ ref.decode_rows(w, dq.Q8_0).astype(np.float64).T
        assert np.abs(got - exact).max() < 0.05 * exact.std()
