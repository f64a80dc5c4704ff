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


def test_q6_k_extreme_block_sums_stay_exact() -> None:
    """Q6_K's per-16 scale products run in float (kernels_cpu.simd_tile, MODE_SPLIT): exact only
    while every sum stays below 2^24. The worst case — codes 0 (q - 32 = -32), scales -128,
    activations all at +/-127 — reaches 2 * 16 * 32 * 127 * 128 = 16,646,144 per block; the
    kernel must still equal the integer twin bit for bit, for 1, 2 and 4 tokens."""
    rows, k = 16, 256
    block = np.zeros(210, np.uint8)  # ql[128] = 0, qh[64] = 0: every code 0
    block[192:208] = np.uint8(0x80)  # the 16 scales: int8 -128
    block[208:210] = np.array([1.0], np.float16).view(np.uint8)  # d
    w = np.tile(block, (rows, 1))
    w[1::2, 0:128] = 0xFF  # odd rows: codes 63 (q - 32 = 31) in their low four bits ...
    w[1::2, 128:192] = 0xFF  # ... and high two
    x = np.ones((4, k), np.float32)
    x[1] = -1.0
    x[2, ::2] = -1.0
    act = quantize(x)
    assert np.abs(act[0].view(np.int8)).max() == 127
    xq = act[0].view(np.int8).reshape(4, -1)
    want = ref.matmul_k(xq, act[1], act[2], w, dq.Q6_K)
    kw = repack_k(w, dq.Q6_K, rows, k)
    for t in (slice(0, 1), slice(0, 2), slice(0, 4)):
        np.testing.assert_array_equal(run(kw, act, rows, 1, t), want[t])
    assert np.abs(want[:2]).max() >= 16_000_000 * act[1].max()  # the bound was reached
