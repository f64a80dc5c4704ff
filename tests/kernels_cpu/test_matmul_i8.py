"""The int8 (VNNI) matmul (Q4_0/Q4_1/Q5_0/Q5_1 layers, Q8_0 outputs): exact against its twin on
quantized activations, random and real tensors, batch- and thread-invariant, and close to the
float matmul on a real output matrix."""

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


@pytest.mark.slow
def test_real_tensors_bit_exact_with_twin(smollm2_path, gemma3_path) -> None:  # type: ignore[no-untyped-def]
    """Real Q4_1 (smollm2), Q5_0 and Q8_0 (gemma3) matrices through repack and kernel equal the
    NumPy twin of the integer arithmetic bit for bit (200 rows: 12 full groups and a short one)."""
    rng = np.random.default_rng(8)
    seen = set()
    for path, name in ((smollm2_path, "blk.3.ffn_down.weight"), (gemma3_path, "blk.1.ffn_up.weight"),
                       (gemma3_path, "token_embd.weight")):
        with GGUFFile(path) as f:
            t = f.tensors[name]
            w = np.ascontiguousarray(t.data.reshape(t.shape[1], -1)[:200])
            qtype = int(t.type)
        seen.add(qtype)
        x = rng.standard_normal((6, w.shape[1] * dq.BLOCK_SHAPE[qtype][0] // dq.BLOCK_SHAPE[qtype][1])).astype(np.float32)
        prep = prepare(w, x, qtype)
        got = run(prep, w.shape[0], 2)
        want = ref.matmul_i8(prep[1].view(np.int8).reshape(6, -1), prep[2], prep[3], w, qtype)
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert seen == {dq.Q4_1, dq.Q5_0, dq.Q8_0}


@pytest.mark.parametrize("qtype", [dq.Q4_0, dq.Q5_0, dq.Q5_1], ids=["Q4_0", "Q5_0", "Q5_1"])
def test_largest_codes_keep_the_pair_sums_exact(qtype: int) -> None:
    """AVX2's i16 pair sums (simd_isa.I16_QUADS) at their worst: every code at its largest (15,
    31) against activations all at +/-127; the kernel equals the integer twin bit for bit, for
    1, 2 and 4 tokens."""
    rows, k = 16, 64
    size = dq.BLOCK_SHAPE[qtype][1]
    block = np.full(size, 0xFF, np.uint8)  # every code bit set
    block[0:2] = np.array([1.0], np.float16).view(np.uint8)  # d
    if qtype == dq.Q5_1:
        block[2:4] = np.array([0.0], np.float16).view(np.uint8)  # m
    w = np.tile(block, (rows, k // 32))
    x = np.ones((4, k), np.float32)
    x[1] = -1.0
    x[2, ::2] = -1.0
    prep = prepare(w, x, qtype)
    want = ref.matmul_i8(prep[1].view(np.int8).reshape(4, -1), prep[2], prep[3], w, qtype)
    for t in (slice(0, 1), slice(0, 2), slice(0, 4)):
        np.testing.assert_array_equal(run(prep, rows, 1, t), want[t])
