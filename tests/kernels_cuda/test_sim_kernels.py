"""Each CUDA kernel under numba's CUDA simulator, on small shapes, against its NumPy twin in
kernels_cpu/reference.py (or the CPU kernel), and batch invariance: a token's row is the same
alone and in a batch."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_sim import ON_CUDA
from gguf import GGMLQuantizationType as T

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="runs in the CUDA simulator's own process, or on a GPU")

if ON_CUDA:
    from edge_infer.formats.quants import quantize
    from edge_infer.kernels_cpu import reference as ref
    from edge_infer.kernels_cuda import attention, layout, matmul, ops

RNG = np.random.default_rng(7)


def _q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, k = x.shape
    xq4, xd, xs16 = np.zeros((t, k // 4), np.int32), np.zeros((t, k // 32), np.float32), np.zeros((t, k // 16), np.int32)
    matmul.quantize_q8_kernel[t, 32](x, xq4, xd, xs16)
    return xq4, xd, xs16


def test_quantize_matches_the_cpu_quantizer() -> None:
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block: scale 0, codes 0
    x[2, 5] = 1e-30
    xq4, xd, xs16 = _q8(x)
    q, d, s16 = ref.quantize_q8_16(x)
    assert np.array_equal(xq4.view(np.int8).reshape(3, 64), q)
    assert np.array_equal(xd, d) and np.array_equal(xs16, s16)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.F16,
                                   T.F32])
def test_matmul_matches_its_twin_and_is_batch_invariant(qtype: T) -> None:
    rows, cols = 5, 256
    w = RNG.standard_normal((rows, cols)).astype(np.float32)
    data = quantize(w, qtype)
    hm = layout.to_host_matrix(data, int(qtype), rows, cols)
    x = RNG.standard_normal((3, cols)).astype(np.float32)
    out = np.zeros((3, rows), np.float32)
    alone = np.zeros((1, rows), np.float32)
    if hm.kind in ("codes", "nibbles"):
        xq4, xd, xs16 = _q8(x)
        codes = layout.unpack_nibbles(hm.q, hm.off) if hm.kind == "nibbles" else hm.q
        q4, nib = hm.q.view(np.int32), hm.kind == "nibbles"
        matmul.matmul_codes_kernel[rows, matmul.THREADS](xq4, xd, xs16, q4, nib, hm.off, hm.s, hm.o, out)
        matmul.matmul_codes_kernel[rows, matmul.THREADS](xq4[1:2], xd[1:2], xs16[1:2], q4, nib, hm.off, hm.s, hm.o,
                                                         alone)
        if nib:  # the int8 form of the same matrix: the same result, bit for bit
            as_codes = np.zeros_like(out)
            matmul.matmul_codes_kernel[rows, matmul.THREADS](xq4, xd, xs16, codes.view(np.int32), False, 0, hm.s, hm.o,
                                                             as_codes)
            assert np.array_equal(out, as_codes)
        # the twin: the same quantized activations, float64 sums of each group's exact terms
        q, d, s16 = ref.quantize_q8_16(x)
        isum = np.einsum("tgk,rgk->trg", q.reshape(3, -1, 16).astype(np.int64), codes.reshape(rows, -1, 16).astype(np.int64))
        dx = np.repeat(d, 2, axis=1)[:, None, :]
        want = (hm.s[None] * dx * isum + hm.o[None] * dx * s16[:, None, :]).sum(-1)
        rtol = 1e-5
    else:
        matmul.matmul_float_kernel[rows, matmul.THREADS](x, hm.f, out)
        matmul.matmul_float_kernel[rows, matmul.THREADS](x[1:2], hm.f, alone)
        want = x.astype(np.float64) @ hm.f.astype(np.float64).T
        rtol = 1e-5
    np.testing.assert_allclose(out, want, rtol=rtol, atol=1e-4)
    assert np.array_equal(alone[0], out[1])  # GEMV row == GEMM row, bit for bit


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.Q3_K])
def test_layout_decodes_exactly_as_the_reference(qtype: T) -> None:
    w = RNG.standard_normal((3, 256)).astype(np.float32)
    data = quantize(w, qtype)
    hm = layout.to_host_matrix(data, int(qtype), 3, 256)
    assert np.array_equal(layout.decode(hm), ref.decode_rows(data, int(qtype)))
    ids = np.array([2, 0], np.int32)
    out = np.zeros((2, 256), np.float32)
    assert hm.kind == ("nibbles" if qtype in (T.Q4_0, T.Q4_1, T.Q4_K) else "float" if qtype in (T.F16, T.Q3_K) else "codes")
    if hm.kind == "codes":
        matmul.embed_codes_kernel[2, 64](ids, hm.q, hm.s, hm.o, np.float32(2.0), out)
    elif hm.kind == "nibbles":
        matmul.embed_nibbles_kernel[2, 64](ids, hm.q, hm.off, hm.s, hm.o, np.float32(2.0), out)
    else:
        matmul.embed_float_kernel[2, 64](ids, hm.f, np.float32(2.0), out)
    assert np.array_equal(out, ref.decode_rows(data, int(qtype))[ids] * np.float32(2.0))


def test_norms_and_activations() -> None:
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    w = RNG.standard_normal(40).astype(np.float32)
    eps = np.float32(1e-6)
    out = np.zeros_like(x)
    ops.rmsnorm_kernel[3, ops.ROW_THREADS](x, w, eps, out)
    np.testing.assert_allclose(out, ref.rmsnorm(x, w, 1e-6), rtol=2e-6, atol=1e-6)
    h, delta = x.copy(), RNG.standard_normal((3, 40)).astype(np.float32)
    ops.add_rmsnorm_kernel[3, ops.ROW_THREADS](h, delta, w, eps, out)
    assert np.array_equal(h, x + delta)
    np.testing.assert_allclose(out, ref.rmsnorm(x + delta, w, 1e-6), rtol=2e-6, atol=1e-6)
    g, u = x, RNG.standard_normal((3, 40)).astype(np.float32)
    grid = (3, 1)
    ops.silu_mul_kernel[grid, ops.ELEM_THREADS](g, u, out)
    np.testing.assert_allclose(out, ref.silu_mul(g, u), rtol=1e-5, atol=1e-6)
    ops.gelu_mul_kernel[grid, ops.ELEM_THREADS](g, u, out)
    np.testing.assert_allclose(out, ref.gelu_mul(g, u), rtol=1e-5, atol=1e-6)
    y = x.copy()
    ops.softcap_kernel[grid, ops.ELEM_THREADS](y, np.float32(2.0))
    np.testing.assert_allclose(y, np.tanh(x / 2) * 2, rtol=1e-6, atol=1e-6)
    rows, got = np.array([2, 0], np.int64), np.zeros((2, 40), np.float32)
    ops.take_rows_kernel[2, 32](x, rows, got)
    assert np.array_equal(got, x[rows])


def test_argmax_takes_the_lowest_index_of_a_tie() -> None:
    x = RNG.standard_normal((3, 50)).astype(np.float32)
    x[1, 7] = x[1, 31] = 9.0
    out = np.zeros(3, np.int32)
    ops.argmax_kernel[3, ops.ROW_THREADS](x, out)
    assert out.tolist() == np.argmax(x, axis=1).tolist() and out[1] == 7


def _pool(n_blocks: int, bs: int, n_kv: int, hd: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    k = RNG.standard_normal((n_blocks, bs, n_kv, hd)).astype(dtype)
    return k, RNG.standard_normal((n_blocks, bs, n_kv, hd)).astype(dtype)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, tables: np.ndarray, seq: np.ndarray, pos: np.ndarray,
            window: int, softcap: float) -> np.ndarray:
    n, hd = q.shape[0], k.shape[3]
    heads, parts = q.shape[1] // hd, int(pos.max()) // attention.PART + 1
    pm, pl = np.zeros((n, heads, parts), np.float32), np.zeros((n, heads, parts), np.float32)
    pa, out = np.zeros((n, heads, parts, hd), np.float32), np.zeros_like(q)
    scale = np.float32(hd**-0.5)
    attention.attention_part_kernel[(n, heads, parts), attention.KEYS](
        q, k, v, tables, seq, pos, scale, window, np.float32(softcap), pm, pl, pa)
    attention.attention_combine_kernel[(n, heads), 32](pm, pl, pa, out)
    return out


@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (5, 0.0), (0, 30.0)])
def test_paged_attention_matches_the_twin_and_is_batch_invariant(window: int, softcap: float) -> None:
    bs, n_kv, hd, heads = 4, 2, 8, 4  # GQA: 2 query heads per KV head
    k, v = _pool(8, bs, n_kv, hd, np.float16)
    tables = np.array([[3, 1, 6, 0], [2, 5, 7, 4]], np.int32)
    pos = np.array([0, 6, 9, 3, 13], np.int32)  # sequence 0: 0, 6, 9; sequence 1: 3, 13
    seq = np.array([0, 0, 0, 1, 1], np.int32)
    q = RNG.standard_normal((5, heads * hd)).astype(np.float32)
    out = _attend(q, k, v, tables, seq, pos, window, softcap)
    # the CUDA pool keeps K as V ([block, offset, head, dim]); the twin reads the CPU pool's
    # transposed K blocks ([block, head, dim, offset])
    want = ref.paged_attention(q, k.view(np.uint16).transpose(0, 2, 3, 1), np.zeros((0, 0, 0), np.float32), v.view(np.uint16),
                               np.zeros((0, 0, 0), np.float32), tables, seq, pos, np.float32(hd**-0.5), window,
                               softcap)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    alone = _attend(q[4:5], k, v, tables, seq[4:5], pos[4:5], window, softcap)
    assert np.array_equal(alone[0], out[4])


def test_attention_over_several_partitions() -> None:
    bs, n_kv, hd = 16, 1, 4
    n_blocks = (attention.PART + 60) // bs + 1
    k, v = _pool(n_blocks, bs, n_kv, hd, np.float32)
    tables = np.arange(n_blocks, dtype=np.int32)[None]
    pos = np.array([attention.PART + 57], np.int32)
    q = RNG.standard_normal((1, hd)).astype(np.float32)
    out = _attend(q, k, v, tables, np.zeros(1, np.int32), pos, 0, 0.0)
    want = ref.paged_attention(q, k.transpose(0, 2, 3, 1), np.zeros((0, 0, 0), np.float32), v,
                               np.zeros((0, 0, 0), np.float32), tables, np.zeros(1, np.int32), pos, np.float32(hd**-0.5),
                               0, 0.0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_qkv_finish_matches_the_cpu_kernel() -> None:
    from edge_infer.kernels_cpu.attention import qkv_finish_kernel

    n, heads, n_kv, hd, bs = 3, 4, 2, 8, 4
    q = RNG.standard_normal((n, heads * hd)).astype(np.float32)
    k = RNG.standard_normal((n, n_kv * hd)).astype(np.float32)
    v = RNG.standard_normal((n, n_kv * hd)).astype(np.float32)
    bq, bk, bv = (RNG.standard_normal(a.shape[1]).astype(np.float32) for a in (q, k, v))
    qn, kn = RNG.standard_normal(hd).astype(np.float32), RNG.standard_normal(hd).astype(np.float32)
    pos = np.array([0, 5, 17], np.int32)
    slots = np.array([2, -1, 9], np.int64)
    inv_freq = 10000.0 ** (-np.arange(0, 6, 2) / 6.0)  # n_rot 6 of hd 8: the last 2 dims stay
    eps, none = np.float32(1e-6), np.zeros((0, 0, 0), np.float32)
    for neox in (False, True):
        cpu = [a.copy() for a in (q, k, v)]
        kc_cpu, vc_cpu = np.zeros((4, n_kv, hd, bs), np.uint16), np.zeros((4, bs, n_kv, hd), np.uint16)  # CPU K transposed
        qkv_finish_kernel(*cpu, bq, bk, bv, qn, kn, 6, pos, inv_freq, 1.0, neox, eps, slots, kc_cpu, none, vc_cpu, none)
        dev = [a.copy() for a in (q, k, v)]
        kc, vc = np.zeros((4, bs, n_kv, hd), np.float16), np.zeros((4, bs, n_kv, hd), np.float16)
        attention.qkv_finish_kernel[n, attention.ROW](*dev, bq, bk, bv, qn, kn, 6, pos, inv_freq, 1.0, neox, eps,
                                                      slots, kc, vc)
        for a, b in zip(dev, cpu):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        kc_rows = kc_cpu.transpose(0, 3, 1, 2)  # as the CUDA pool keeps K: [block, offset, head, dim]
        np.testing.assert_allclose(kc.astype(np.float32), kc_rows.view(np.float16).astype(np.float32), rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(vc.astype(np.float32), vc_cpu.view(np.float16).astype(np.float32), rtol=1e-3, atol=1e-3)


def test_copy_blocks() -> None:
    k, v = _pool(4, 2, 1, 4, np.float16)
    k0, v0 = k.copy(), v.copy()
    attention.copy_blocks_kernel[2, 16](k, v, np.array([[0, 3], [1, 2]], np.int32))
    assert np.array_equal(k[3], k0[0]) and np.array_equal(v[2], v0[1]) and np.array_equal(k[0], k0[0])
