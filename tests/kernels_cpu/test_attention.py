"""Paged attention equals dense attention: random shapes, context lengths that are not
multiples of the block size, GQA ratios 1/3/7, sliding windows, f16 and f32 pools and
llama.cpp's quantized KV types (K and V of different types too), scattered block tables; and a
token's output does not depend on what else is in the batch."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.attention import qkv_finish_kernel, store_kv_kernel
from edge_infer.kernels_cpu.attention_tiles import paged_attention_kernel
from edge_infer.kernels_cpu.backend import CpuBackend

NO_SINKS = np.empty(0, np.float32)


def build(rng: np.random.Generator, lens: list[int], n_kv: int, rep: int, hd: int, bs: int, kv_type: str):
    """A pool (K/V types "K/V", or one for both) with each sequence's keys written through
    store_kv_kernel at scattered blocks."""
    need = sum(-(-n // bs) for n in lens)
    n_blocks = need + 5
    perm = rng.permutation(n_blocks)
    width = max(-(-n // bs) for n in lens)
    tables = np.zeros((len(lens), width), np.int32)
    kc, ks, vc, vs = CpuBackend.make_kv_pool(None, 1, n_blocks, bs, n_kv, hd, *kv_type.split("/"))[0]  # type: ignore[arg-type]
    at = 0
    for s, n in enumerate(lens):
        nb = -(-n // bs)
        tables[s, :nb] = perm[at : at + nb]
        at += nb
        pos = np.arange(n)
        slots = (tables[s, pos // bs].astype(np.int64) * bs + pos % bs)
        k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
        v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
        store_kv_kernel(k, v, slots, kc, ks, vc, vs)
    return kc, ks, vc, vs, tables


@pytest.mark.parametrize("rep", [1, 3, 7])
@pytest.mark.parametrize("kv_type", ["f16", "f32", "q4_0"])
@pytest.mark.parametrize(("window", "bs", "softcap"), [(0, 4, 0.0), (5, 4, 1.5), (0, 16, 1.5), (19, 16, 0.0)])
def test_paged_equals_dense(rep: int, kv_type: str, window: int, bs: int, softcap: float) -> None:
    """softcap 1.5 bites: the scores of these random queries reach several units."""
    check_paged(rep, kv_type, window, bs, softcap, 32)


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "f16/q4_0", "q8_0/f32"])
def test_quantized_kv_types(kv_type: str) -> None:
    """Every llama.cpp KV type, and K and V of different kinds, against the reference reading
    the same blocks (kernels_cpu.reference decodes them with formats.quants)."""
    check_paged(3, kv_type, 0, 16, 0.0, 64)


@pytest.mark.parametrize(("hd", "kv_type"), [(40, "f16"), (96, "q5_1"), (112, "f32")])
def test_head_dims_past_whole_vector_slices(hd: int, kv_type: str) -> None:
    """Head dims that are not 4 x 16 lanes: the value sums' 2- and 1-slice tiles and the
    dimensions after the last 16 (40 = 16 + 16 + 8, 96 = 64 + 32, 112 = 64 + 32 + 16)."""
    check_paged(3, kv_type, 0, 16, 0.0, hd)


def check_paged(rep: int, kv_type: str, window: int, bs: int, softcap: float, hd: int) -> None:
    """Paged attention equals the dense reference, and each query alone gives the same bits."""
    rng = np.random.default_rng(rep * 10 + window + bs + hd)
    cap = np.float32(softcap)
    n_kv = 2
    lens = [1, 7, 13] if bs == 4 else [1, 23, 41]
    kc, ks, vc, vs, tables = build(rng, lens, n_kv, rep, hd, bs, kv_type)
    # queries: the last 3 positions of sequence 2, the only position of 0, the last of 1
    token_seq = np.array([2, 2, 2, 0, 1], np.int32)
    last = lens[2] - 1
    positions = np.array([last - 2, last - 1, last, 0, lens[1] - 1], np.int32)
    q = rng.standard_normal((5, n_kv * rep * hd)).astype(np.float32)
    out = np.full_like(q, np.nan)
    paged_attention_kernel(q, kc, ks, vc, vs, tables, token_seq, positions, np.float32(0.2), window, cap, NO_SINKS, out, 2)
    want = ref.paged_attention(q, kc, ks, vc, vs, tables, token_seq, positions, 0.2, window, float(cap))
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    # batch invariance: each query alone gives the identical row, whether its kv-heads are
    # work items (1 thread) or, split into query heads, share 3 threads
    for i in range(5):
        for threads in (1, 3):
            alone = np.empty((1, q.shape[1]), np.float32)
            paged_attention_kernel(q[i : i + 1], kc, ks, vc, vs, tables, token_seq[i : i + 1],
                                   positions[i : i + 1], np.float32(0.2), window, cap, NO_SINKS, alone, threads)
            np.testing.assert_array_equal(alone[0], out[i])


def test_attention_sinks_join_the_softmax() -> None:
    """gpt-oss's sinks: a logit per head in the max and the sum, with no value; large sinks
    take most of the weight (the output shrinks), and each query alone gives the same row."""
    rng = np.random.default_rng(7)
    n_kv, rep, hd, bs = 2, 3, 32, 4
    kc, ks, vc, vs, tables = build(rng, [9, 5], n_kv, rep, hd, bs, "f32")
    token_seq, positions = np.array([0, 0, 1], np.int32), np.array([3, 8, 4], np.int32)
    q = rng.standard_normal((3, n_kv * rep * hd)).astype(np.float32)
    sinks = np.array([-2.0, 0.0, 1.0, 3.0, 6.0, 0.5], np.float32)
    out, plain = np.full_like(q, np.nan), np.full_like(q, np.nan)
    paged_attention_kernel(q, kc, ks, vc, vs, tables, token_seq, positions, np.float32(0.2), 0, np.float32(0.0), sinks,
                           out, 2)
    want = ref.paged_attention(q, kc, ks, vc, vs, tables, token_seq, positions, 0.2, 0, sinks=sinks)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    paged_attention_kernel(q, kc, ks, vc, vs, tables, token_seq, positions, np.float32(0.2), 0, np.float32(0.0),
                           NO_SINKS, plain, 2)
    head = 4 * hd  # sink 6.0: most of the weight goes to the sink
    assert np.abs(out[:, head : head + hd]).sum() < 0.1 * np.abs(plain[:, head : head + hd]).sum()
    for i in range(3):
        alone = np.empty((1, q.shape[1]), np.float32)
        paged_attention_kernel(q[i : i + 1], kc, ks, vc, vs, tables, token_seq[i : i + 1], positions[i : i + 1],
                               np.float32(0.2), 0, np.float32(0.0), sinks, alone, 1)
        np.testing.assert_array_equal(alone[0], out[i])


def test_store_skips_negative_slots_and_rounds_to_f16() -> None:
    kc = np.zeros((2, 1, 4, 2), np.uint16)  # [block, head, dim, offset]
    vc = np.zeros((2, 2, 1, 4), np.uint16)
    none = np.zeros((0, 0, 0), np.float32)
    k = np.array([[1.0, 2.5, -3.0, 1 / 3], [9, 9, 9, 9]], np.float32)
    store_kv_kernel(k, k, np.array([3, -1], np.int64), kc, none, vc, none)
    np.testing.assert_array_equal(vc[1, 1, 0].view(np.float16), k[0].astype(np.float16))
    np.testing.assert_array_equal(kc[1, 0, :, 1].view(np.float16), k[0].astype(np.float16))
    assert not vc[0].any() and not vc[1, 0].any() and not kc[0].any() and not kc[1, 0, :, 0].any()


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
def test_block_store_writes_the_reference_quantizers_bytes(kv_type: str) -> None:
    """Each (token, head) row is head_dim / 32 GGML blocks, byte for byte what
    formats.quantizers (bit-exact with gguf-py, ggml's reference; IQ4_NL: ggml's row reference
    without the scale search, as ggml-cpu's store) writes for the head rotated
    by the 64 x 64 Walsh-Hadamard matrix (llama.cpp's rotation of quantized K and V); an all-zero head
    reads back as zeros (its scale is ggml's -0.0 for q4_0 / q5_0: max / -8 of max 0); a
    negative slot writes nothing."""
    from edge_infer.formats.quantizers import QUANTIZERS
    from edge_infer.formats.quantizers_iq4 import quantize_iq4_nl_row_ref
    from edge_infer.formats.weight_types import by_name

    n_kv, hd, bs = 2, 64, 4
    kc, ks, vc, vs = CpuBackend.make_kv_pool(None, 1, 2, bs, n_kv, hd, kv_type)[0]  # type: ignore[arg-type]
    k = np.random.default_rng(2).standard_normal((3, n_kv * hd)).astype(np.float32)
    k[1, hd:] = 0.0
    v = -2 * k
    store_kv_kernel(k, v, np.array([5, 2, -1], np.int64), kc, ks, vc, vs)
    quantize = quantize_iq4_nl_row_ref if kv_type == "iq4_nl" else QUANTIZERS[by_name(kv_type.upper()).id]  # type: ignore[index]
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < hd:
        h = np.block([[h, h], [h, -h]])
    assert list(ks) == [by_name(kv_type.upper()).id, hd] and list(vs) == [ks[0], 64]
    for t, slot in ((0, 5), (1, 2)):
        for cache, aux, src in ((kc, ks, k), (vc, vs, v)):
            rotated = (src[t].reshape(n_kv, hd).astype(np.float64) @ h / np.sqrt(hd)).astype(np.float32)
            want = quantize(rotated.reshape(-1, 32)).reshape(n_kv, -1)
            heads = 1 if t == 1 else 2
            np.testing.assert_array_equal(cache[slot // bs, slot % bs, :heads], want[:heads])
            if t == 1:
                assert not ref.cache_values(cache, aux)[slot // bs, slot % bs, 1].any()
    assert not kc[0, 0].any() and not vc[1, 3].any()


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("extras", [False, True, "full"])
def test_qkv_finish_matches_reference(neox: bool, extras: bool | str) -> None:
    """Biases, QK-norm per head (gemma, qwen3) or over the whole row (extras="full": olmo2),
    RoPE (partial rotary dims too, cos and sin scaled by mscale) and the K/V store, in one kernel."""
    rng = np.random.default_rng(5)
    T, n_heads, n_kv, hd, n_rot, bs = 5, 4, 2, 32, 16, 4
    q = rng.standard_normal((T, n_heads * hd)).astype(np.float32)
    k = rng.standard_normal((T, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((T, n_kv * hd)).astype(np.float32)
    none = np.empty(0, np.float32)
    bq, bk, bv = (rng.standard_normal(a.shape[1]).astype(np.float32) if extras else none for a in (q, k, v))
    qn, kn = (rng.standard_normal(hd).astype(np.float32) if extras else none for _ in range(2))
    if extras == "full":
        qn, kn = rng.standard_normal(n_heads * hd).astype(np.float32), rng.standard_normal(n_kv * hd).astype(np.float32)
    mscale = 1.3 if extras else 1.0
    pos = np.array([0, 3, 7, 100, 4000], np.int32)
    inv = 10000.0 ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    kc = np.zeros((3, n_kv, hd, bs), np.float32)  # K blocks transposed
    vc = np.zeros((3, bs, n_kv, hd), np.float32)
    e3 = np.zeros((0, 0, 0), np.float32)
    slots = np.array([0, 1, 2, 5, -1], np.int64)
    want_q, want_k, want_v = q.copy(), k.copy(), v.copy()
    if extras:
        want_q, want_k, want_v = want_q + bq, want_k + bk, want_v + bv
        full = extras == "full"
        want_q = ref.rmsnorm(want_q.reshape(T, -1, n_heads * hd if full else hd), qn, 1e-6).reshape(T, -1)
        want_k = ref.rmsnorm(want_k.reshape(T, -1, n_kv * hd if full else hd), kn, 1e-6).reshape(T, -1)
    want_q = ref.rope(want_q, n_heads, hd, n_rot, pos, inv, neox, mscale)
    want_k = ref.rope(want_k, n_kv, hd, n_rot, pos, inv, neox, mscale)
    qkv_finish_kernel(q, k, v, bq, bk, bv, qn, kn, n_rot, pos, inv, mscale, neox, np.float32(1e-6), slots, kc, e3,
                      vc, e3)
    np.testing.assert_allclose(q, want_q, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(k, want_k, rtol=2e-5, atol=2e-5)
    for t, s in enumerate(slots):
        if s >= 0:
            np.testing.assert_array_equal(kc[s // bs, :, :, s % bs].reshape(-1), k[t])
            np.testing.assert_array_equal(vc[s // bs, s % bs].reshape(-1), v[t])
    np.testing.assert_allclose(v, want_v, rtol=1e-6)


@pytest.mark.parametrize(("kv_type", "n_kv", "rep", "hd", "window"), [
    ("f16", 2, 3, 64, 0), ("f32", 2, 3, 64, 0), ("q8_0", 2, 3, 64, 0), ("q4_0", 2, 3, 64, 0),
    ("q4_0", 1, 7, 128, 0), ("q8_0/f16", 2, 6, 64, 0), ("f16/q4_0", 1, 5, 64, 0), ("q4_0/q8_0", 2, 2, 128, 0),
    ("q8_0", 2, 3, 64, 21), ("f16/q4_0", 1, 4, 64, 21)])
def test_pools_read_in_place_give_the_converted_bits(kv_type: str, n_kv: int, rep: int, hd: int,
                                                     window: int) -> None:
    """Blocks of 16 and 32 keys are read in place by the lanes (halves widened; a decode row's
    Q8_0 / Q4_0 codes decoded in registers, kernels_cpu.kv_lanes), blocks of 8 through the
    converted scratch (kv_read): the same keys and values give the same bits, for a decode row
    (GQA 2 to 7: the in-place calls' row counts) and a prefill tile, over a context of 77 keys
    (a partial last chunk); K and V of one type or of two; a sliding window (21: its first
    key mid-chunk)."""
    rng = np.random.default_rng(5)
    n = 77
    kt, _, vt = kv_type.partition("/")
    k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
    q = rng.standard_normal((n, n_kv * rep * hd)).astype(np.float32)
    outs = []
    for bs in (8, 16, 32):
        nb = -(-n // bs)
        kc, ks, vc, vs = CpuBackend.make_kv_pool(None, 1, nb + 3, bs, n_kv, hd, kt, vt or None)[0]  # type: ignore[arg-type]
        table = (np.arange(nb, dtype=np.int32)[::-1] + 3).reshape(1, nb)  # scattered: blocks in reverse
        pos = np.arange(n)
        store_kv_kernel(k, v, table[0, pos // bs].astype(np.int64) * bs + pos % bs, kc, ks, vc, vs)
        got = []
        for rows in (slice(n - 1, n), slice(40, 56)):  # the last token decoding; a 16-token tile
            out = np.zeros((rows.stop - rows.start, q.shape[1]), np.float32)
            paged_attention_kernel(q[rows], kc, ks, vc, vs, table, np.zeros(out.shape[0], np.int32),
                                   pos[rows].astype(np.int32), np.float32(0.125), window, np.float32(0.0), NO_SINKS,
                                   out, 2)
            got.append(out)
        outs.append(got)
    for got in outs[1:]:
        for a, b in zip(got, outs[0]):
            assert np.array_equal(a, b)
