"""The encoder kernels (LayerNorm after a residual add, the encoder's input, bias + GELU,
bidirectional attention within each input, with ALiBi) against their NumPy twins, on row
counts both sides of the serial/parallel switch, and each input's result independent of the
other inputs in the step."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu import encoder, reference_encoder
from edge_infer.models.encoder import alibi_slopes

EPS = np.float32(1e-12)


def _rows(t: int, d: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(0, scale, (t, d)) + 0.3).astype(np.float32)


@pytest.mark.parametrize("t", [3, 300])
def test_norm_kernels_match_twins(t: int) -> None:
    d = 64
    x, res = _rows(t, d, 0, 2.0), _rows(t, d, 1)
    w, b, bias = _rows(1, d, 2)[0], _rows(1, d, 3)[0], _rows(1, d, 4)[0]
    out = np.empty_like(x)
    encoder.layernorm_kernel(x, w, b, EPS, out)
    np.testing.assert_allclose(out, reference_encoder.layernorm(x, w, b, 1e-12), rtol=1e-5, atol=1e-5)
    for bb in (bias, bias[:0]):
        xx = x.copy()
        encoder.add_layernorm_kernel(xx, bb, res, w, b, EPS, out)
        np.testing.assert_allclose(out, reference_encoder.add_layernorm(x, bb, res, w, b, 1e-12), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(xx, x + (bb if bb.size else 0) + res, rtol=1e-6)  # the sum kept in x
    table, pos = _rows(40, d, 5), np.random.default_rng(6).integers(0, 40, t).astype(np.int32)
    for tab in (table, table[:0]):
        xx = x.copy()
        encoder.input_layernorm_kernel(xx, bias, tab, pos, w, b, EPS, out)
        np.testing.assert_allclose(out, reference_encoder.input_layernorm(x, bias, tab, pos, w, b, 1e-12),
                                   rtol=1e-5, atol=1e-5)
    encoder.bias_gelu_kernel(x, bias, out)
    np.testing.assert_allclose(out, reference_encoder.bias_gelu(x, bias), rtol=1e-5, atol=1e-5)


def _inputs(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    starts = np.cumsum([0, *lengths[:-1]])
    seq_start = np.repeat(starts, lengths).astype(np.int32)
    return seq_start, (seq_start + np.repeat(lengths, lengths)).astype(np.int32)


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_matches_twin_and_is_batch_invariant(alibi: bool, kv_heads: int) -> None:
    heads, hd, lengths = 4, 16, [5, 1, 23, 9]
    t = sum(lengths)
    q, k, v = _rows(t, heads * hd, 0), _rows(t, kv_heads * hd, 1), _rows(t, kv_heads * hd, 2)
    slopes = alibi_slopes(heads, 8.0) if alibi else np.empty(0, np.float32)
    scale = np.float32(hd**-0.5)
    seq_start, seq_end = _inputs(lengths)
    out = np.empty_like(q)
    encoder.encoder_attention_kernel(q, k, v, seq_start, seq_end, hd, scale, slopes, 0, 2, out)
    ref = reference_encoder.encoder_attention(q, k, v, seq_start, seq_end, hd, float(scale), slopes)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # the third input alone gives the same bits as among the others
    s0, n = sum(lengths[:2]), lengths[2]
    alone = np.empty((n, heads * hd), np.float32)
    ss, se = _inputs([n])
    encoder.encoder_attention_kernel(q[s0 : s0 + n].copy(), k[s0 : s0 + n].copy(), v[s0 : s0 + n].copy(), ss, se, hd,
                                     scale, slopes, 0, 2, alone)
    np.testing.assert_array_equal(alone, out[s0 : s0 + n])
    # both directions: an input's first token sees its last one
    k2 = k.copy()
    k2[s0 + n - 1] += 3.0
    out2 = np.empty_like(q)
    encoder.encoder_attention_kernel(q, k2, v, seq_start, seq_end, hd, scale, slopes, 0, 2, out2)
    assert np.abs(out2[s0] - out[s0]).max() > 1e-3
    np.testing.assert_array_equal(out2[:s0], out[:s0])


def test_symmetric_window_matches_twin() -> None:
    """A sliding layer's keys within window // 2 rows either side, clipped to the input."""
    heads, hd, lengths = 2, 16, [12, 20]
    t = sum(lengths)
    q, k, v = _rows(t, heads * hd, 0), _rows(t, heads * hd, 1), _rows(t, heads * hd, 2)
    seq_start, seq_end = _inputs(lengths)
    for window in (4, 7):
        out = np.empty_like(q)
        encoder.encoder_attention_kernel(q, k, v, seq_start, seq_end, hd, np.float32(0.25), np.empty(0, np.float32),
                                         window, 2, out)
        ref = reference_encoder.encoder_attention(q, k, v, seq_start, seq_end, hd, 0.25, np.empty(0, np.float32),
                                                  window)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        full = reference_encoder.encoder_attention(q, k, v, seq_start, seq_end, hd, 0.25, np.empty(0, np.float32))
        assert np.abs(out - full).max() > 1e-2


def test_alibi_slopes_follow_ggml() -> None:
    """ggml_soft_max_ext's slopes: powers of 2^(-8/n) for the first 2^floor(log2 n) heads, then
    odd powers of the half step."""
    np.testing.assert_allclose(alibi_slopes(4, 8.0), [2**-2, 2**-4, 2**-6, 2**-8])
    s6 = alibi_slopes(6, 8.0)
    np.testing.assert_allclose(s6[:4], [2**-2, 2**-4, 2**-6, 2**-8])
    np.testing.assert_allclose(s6[4:], [2**-1, 2**-3])
    assert alibi_slopes(4, 0.0).size == 0


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (64, 1024)])
def test_softmax_rows_match_twin_and_each_row_stands_alone(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    x[0, -1] = 60.0  # a dominant score: every other exp of that row underflows toward 0
    want_e, want_inv = reference_encoder.softmax_rows(x)
    got, inv = x.copy(), np.empty(shape[0], np.float32)
    encoder.softmax_rows_kernel(got, inv)
    np.testing.assert_allclose(got, want_e, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(inv, want_inv, rtol=2e-6)
    for t in (0, shape[0] - 1):  # a row alone gives the same bits as in the batch
        one, one_inv = x[t:t + 1].copy(), np.empty(1, np.float32)
        encoder.softmax_rows_kernel(one, one_inv)
        assert one.tobytes() == got[t:t + 1].tobytes() and one_inv[0] == inv[t]
