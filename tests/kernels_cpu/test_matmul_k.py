"""The K-quant int8 matmul (Q4_K, Q5_K, Q6_K): repacked at the file's size, exact against its
NumPy twin (computed from the GGUF bytes), batch- and thread-invariant; real tensors too."""

from __future__ import annotations

import numpy as np
import pytest
from check_k import K_TYPES, check_k, quantize, run

from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.repack_k import repack_k


def test_k_quant_matmul_against_twin_and_invariance() -> None:
    check_k(np.random.default_rng(5))


@pytest.mark.slow
def test_real_k_quant_tensors_bit_exact_with_twin(qwen2_path) -> None:  # type: ignore[no-untyped-def]
    """qwen2.5-coder-0.5b's Q4_K and Q6_K matrices (its widths 896 and 4864 are not multiples of
    256 everywhere: the ones that are) through repack and kernel equal the twin bit for bit."""
    rng = np.random.default_rng(9)
    seen = set()
    with GGUFFile(qwen2_path) as f:
        for name, t in f.tensors.items():
            qtype = int(t.type)
            if qtype not in K_TYPES or qtype in seen or t.shape[0] % 256 or len(t.shape) != 2:
                continue
            seen.add(qtype)
            w = np.ascontiguousarray(t.data.reshape(t.shape[1], -1)[:40])
            x = rng.standard_normal((5, t.shape[0])).astype(np.float32)
            act = quantize(x)
            got = run(repack_k(w, qtype, 40, t.shape[0]), act, 40, 2)
            xq = act[0].view(np.int8).reshape(5, -1)
            np.testing.assert_array_equal(got, ref.matmul_k(xq, act[1], act[2], w, qtype), err_msg=name)
    assert dq.Q4_K in seen or dq.Q6_K in seen, seen
