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


@pytest.mark.parametrize("qtype", [dq.Q4_K, dq.Q5_K, dq.Q6_K], ids=["Q4_K", "Q5_K", "Q6_K"])
def test_largest_codes_keep_the_pair_sums_exact(qtype: int) -> None:
    """On AVX2 a block's vpmaddubsw pair sums add up in i16 for several quads before one
    vpmaddwd widens them (simd_isa.I16_QUADS: 8 for 4-bit codes, 4 for 5-bit, 2 for 6-bit),
    exact only while no lane passes 32,767. Every code at its largest (15, 31, 63) against
    activations all at +/-127 is the worst case (4-bit: 8 * 2 * 15 * 127 = 30,480); the kernel
    must still equal the integer twin bit for bit, for 1, 2 and 4 tokens."""
    rows, k = 16, 256
    size = dq.BLOCK_SHAPE[qtype][1]
    block = np.full(size, 0xFF, np.uint8)  # every code bit set: the largest codes
    if qtype == dq.Q6_K:
        block[192:208] = 1  # the scales per 16, int8
        block[208:210] = np.array([1.0], np.float16).view(np.uint8)
    else:  # d, dmin, then 12 bytes of 6-bit scales and mins: scales 1, mins 0
        block[0:4] = np.array([1.0, 0.0], np.float16).view(np.uint8)
        block[4:16] = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)
    w = np.tile(block, (rows, 1))
    x = np.ones((4, k), np.float32)
    x[1] = -1.0
    x[2, ::2] = -1.0
    act = quantize(x)
    xq = act[0].view(np.int8).reshape(4, -1)
    want = ref.matmul_k(xq, act[1], act[2], w, qtype)
    kw = repack_k(w, qtype, rows, k)
    for t in (slice(0, 1), slice(0, 2), slice(0, 4)):
        np.testing.assert_array_equal(run(kw, act, rows, 1, t), want[t])
    top = {dq.Q4_K: 15, dq.Q5_K: 31, dq.Q6_K: 31}[qtype]  # Q6_K's weights are code - 32
    assert np.abs(want[0]).min() >= top * k * 127 * act[1].max() * 0.99  # the largest sums were reached
