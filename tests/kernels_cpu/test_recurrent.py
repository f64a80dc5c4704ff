"""The recurrent layers' kernels (LFM2's short convolution; Mamba2's convolution, selective
scan and gated group norm; Qwen3.5's gated delta rule, its per-head gated norm and gated
attention's split and sigmoid gate) against their NumPy twins, and the invariance they keep: a token's
output and its sequence's state are bit-identical alone or batched with other sequences, in
one step or split over several, and for any thread count."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from edge_infer.kernels_cpu import reference_recurrent as ref
from edge_infer.kernels_cpu.ops import sigmoid_mul_kernel, split_gated_q_kernel
from edge_infer.kernels_cpu.recurrent import (
    conv_silu_kernel,
    delta_rule_kernel,
    gated_group_rmsnorm_kernel,
    head_rmsnorm_gate_kernel,
    short_conv_kernel,
    ssm_scan_kernel,
)

D, TAPS, SLOTS = 80, 4, 5  # 80 channels: a partial work item of the 64-channel split


def _batch(lengths: list[int], starts: list[int], slots: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seq_slot, token_seq, positions) of a step whose sequence i has lengths[i] tokens from starts[i]."""
    token_seq = np.concatenate([np.full(n, i, np.int32) for i, n in enumerate(lengths)])
    positions = np.concatenate([np.arange(s, s + n, dtype=np.int32) for s, n in zip(starts, lengths)])
    return np.array(slots, np.int32), token_seq, positions


NO_SNAPSHOTS = (np.empty(0, np.int32), np.empty(0, np.int32))


def _conv(bcx: np.ndarray, w: np.ndarray, state: np.ndarray, batch: tuple[np.ndarray, ...],
          snapshots: tuple[np.ndarray, np.ndarray] = NO_SNAPSHOTS) -> np.ndarray:
    out = np.full((bcx.shape[0], D), np.nan, np.float32)
    short_conv_kernel(bcx, w, state, *batch, *snapshots, out)
    return out


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    bcx = rng.standard_normal((40, 3 * D)).astype(np.float32)
    w = rng.standard_normal((D, TAPS)).astype(np.float32)
    state = rng.standard_normal((SLOTS, TAPS - 1, D)).astype(np.float32)  # stale values: position 0 ignores them
    return bcx, w, state


def test_short_conv_matches_reference(data: tuple[np.ndarray, ...]) -> None:
    bcx, w, state = data
    batch = _batch([25, 10, 5], [0, 7, 0], [3, 1, 0])  # the middle one resumes from its slot's state
    snaps = (np.array([3, 3, 30], np.int32), np.array([2, 4, 2], np.int32))  # row 30's snapshot lands last in 2
    want, want_state = ref.short_conv(bcx, w, state, *batch, *snaps)
    got_state = state.copy()
    got = _conv(bcx, w, got_state, batch, snaps)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_state, want_state, rtol=1e-6, atol=1e-6)
    plain_state = state.copy()
    np.testing.assert_array_equal(_conv(bcx, w, plain_state, batch), got)  # snapshots change no output
    assert np.array_equal(plain_state[[2, 4]], state[[2, 4]]), "slots no sequence names are untouched"
    assert not np.array_equal(got_state[4], state[4]) and not np.array_equal(got_state[4], got_state[2])


def test_short_conv_is_batch_chunk_and_thread_invariant(data: tuple[np.ndarray, ...]) -> None:
    bcx, w, state = data
    s1 = state.copy()
    together = _conv(bcx[:30], w, s1, _batch([20, 10], [0, 0], [0, 1]))
    alone_state = state.copy()
    first = _conv(bcx[:7], w, alone_state, _batch([7], [0], [2]))
    rest = _conv(bcx[7:20], w, alone_state, _batch([13], [7], [2]))
    np.testing.assert_array_equal(np.concatenate([first, rest]), together[:20])
    np.testing.assert_array_equal(alone_state[2], s1[0])
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        s2 = state.copy()
        np.testing.assert_array_equal(_conv(bcx[:30], w, s2, _batch([20, 10], [0, 0], [0, 1])), together)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(s2, s1)


# Mamba2: H heads of P, groups G of Ns state values, a convolution of L taps over [x | B | C]
H, P, G, NS, L = 6, 8, 2, 16, 4
E, C = H * P, H * P + 2 * G * NS
ZXDT = 2 * E + 2 * G * NS + H  # the in_proj output [z | x B C | dt]


def _mamba_data(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "zxdt": rng.standard_normal((n, ZXDT)).astype(np.float32),
        "w": rng.standard_normal((C, L)).astype(np.float32) * 0.5,
        "bias": rng.standard_normal(C).astype(np.float32) * 0.1,
        "dt_bias": rng.uniform(-4.0, 1.0, H).astype(np.float32),  # some softplus inputs past 20 below
        "a": -np.exp(rng.uniform(-1.0, 0.5, H)).astype(np.float32),
        "d": rng.standard_normal(H).astype(np.float32),
        "conv_state": rng.standard_normal((SLOTS, L - 1, C)).astype(np.float32),
        "scan_state": rng.standard_normal((SLOTS, H, P, NS)).astype(np.float32),
        "norm": rng.uniform(0.5, 1.5, E).astype(np.float32),
    }


def _mamba(m: dict[str, np.ndarray], rows: slice, batch: tuple[np.ndarray, ...],
           snapshots: tuple[np.ndarray, np.ndarray] = NO_SNAPSHOTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(convolved x B C, scan output, gated norm) of the tokens `rows` as one step."""
    zxdt = np.ascontiguousarray(m["zxdt"][rows])
    n = zxdt.shape[0]
    xbc, y, out = (np.full((n, w), np.nan, np.float32) for w in (C, E, E))
    conv_silu_kernel(zxdt, E, m["w"], m["bias"], m["conv_state"], *batch, *snapshots, xbc)
    ssm_scan_kernel(xbc, zxdt, E + C, m["dt_bias"], m["a"], m["d"], m["scan_state"], *batch, *snapshots, y)
    gated_group_rmsnorm_kernel(y, zxdt, m["norm"], G, np.float32(1e-5), out)
    return xbc, y, out


def test_mamba2_kernels_match_reference() -> None:
    m = _mamba_data(30)
    m["zxdt"][3, E + C] = 25.0  # softplus's linear branch
    batch = _batch([18, 12], [0, 5], [1, 3])
    snaps = (np.array([4, 20], np.int32), np.array([0, 2], np.int32))
    conv_state, scan_state = m["conv_state"].copy(), m["scan_state"].copy()
    xbc, y, out = _mamba(m, slice(0, 30), batch, snaps)
    want_xbc, want_conv = ref.conv_silu(m["zxdt"], E, m["w"], m["bias"], conv_state, *batch, *snaps)
    np.testing.assert_allclose(xbc, want_xbc, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m["conv_state"], want_conv, rtol=1e-6, atol=1e-6)
    want_y, want_scan = ref.ssm_scan(xbc, m["zxdt"], E + C, m["dt_bias"], m["a"], m["d"], scan_state, *batch, *snaps)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m["scan_state"], want_scan, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, ref.gated_group_rmsnorm(y, m["zxdt"], m["norm"], G, 1e-5), rtol=1e-4, atol=1e-4)
    plain, no_norm = np.empty_like(out), np.empty(0, np.float32)  # falcon-h1 without ssm_norm: y * silu(z)
    gated_group_rmsnorm_kernel(y, m["zxdt"], no_norm, G, np.float32(1e-5), plain)
    np.testing.assert_allclose(plain, ref.gated_group_rmsnorm(y, m["zxdt"], no_norm, G, 1e-5), rtol=1e-5, atol=1e-6)
    z = m["zxdt"][:, :E].astype(np.float64)
    np.testing.assert_allclose(plain, z / (1.0 + np.exp(-z)) * y, rtol=1e-5, atol=1e-6)


def test_mamba2_kernels_are_batch_chunk_and_thread_invariant() -> None:
    m = _mamba_data(30)
    start = {k: v.copy() for k, v in m.items()}
    together = _mamba(m, slice(0, 30), _batch([20, 10], [0, 0], [0, 1]))
    after = (m["conv_state"].copy(), m["scan_state"].copy())
    m = {k: v.copy() for k, v in start.items()}
    first = _mamba(m, slice(0, 7), _batch([7], [0], [2]))
    rest = _mamba(m, slice(7, 20), _batch([13], [7], [2]))
    for a, b, whole in zip(first, rest, together):
        np.testing.assert_array_equal(np.concatenate([a, b]), whole[:20])
    np.testing.assert_array_equal(m["scan_state"][2], after[1][0])
    np.testing.assert_array_equal(m["conv_state"][2], after[0][0])
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        m = {k: v.copy() for k, v in start.items()}
        for a, b in zip(_mamba(m, slice(0, 30), _batch([20, 10], [0, 0], [0, 1])), together):
            np.testing.assert_array_equal(a, b)
    finally:
        numba.set_num_threads(before)


# Qwen3.5's delta rule: H value heads and HK key heads of S
DH, DHK, DS = 4, 2, 16
TILED = np.arange(DH, dtype=np.int32) % DHK  # Qwen3.5: value head h reads key head h % Hk
GROUPED = np.arange(DH, dtype=np.int32) // (DH // DHK)  # Qwen3-Next: h // (H / Hk)
DC = 2 * DHK * DS + DH * DS


def _delta_data(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {"qkv": rng.standard_normal((n, DC)).astype(np.float32), "beta": rng.standard_normal((n, DH)).astype(np.float32),
            "alpha": rng.standard_normal((n, DH)).astype(np.float32),
            "dt_bias": rng.uniform(-4.0, 1.0, DH).astype(np.float32), "a": -np.exp(rng.uniform(-1.0, 0.5, DH)).astype(np.float32),
            "state": rng.standard_normal((SLOTS, DH, DS, DS)).astype(np.float32)}


def _delta(m: dict[str, np.ndarray], rows: slice, batch: tuple[np.ndarray, ...],
           snapshots: tuple[np.ndarray, np.ndarray] = NO_SNAPSHOTS) -> np.ndarray:
    y = np.full((m["qkv"][rows].shape[0], DH * DS), np.nan, np.float32)
    delta_rule_kernel(np.ascontiguousarray(m["qkv"][rows]), np.ascontiguousarray(m["beta"][rows]),
                      np.ascontiguousarray(m["alpha"][rows]), m["dt_bias"], m["a"], m["state"], *batch, *snapshots,
                      m.get("k_head_of", TILED), np.float32(1e-6), y)
    return y


def test_delta_rule_and_gates_match_reference() -> None:
    m = _delta_data(30)
    batch = _batch([18, 12], [0, 5], [1, 3])
    snaps = (np.array([4, 20], np.int32), np.array([0, 2], np.int32))
    start = m["state"].copy()
    y = _delta(m, slice(0, 30), batch, snaps)
    want, want_state = ref.delta_rule(m["qkv"], m["beta"], m["alpha"], m["dt_bias"], m["a"], start, *batch, *snaps,
                                      TILED, 1e-6)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m["state"], want_state, rtol=1e-4, atol=1e-4)
    m["state"], m["k_head_of"] = start.copy(), GROUPED  # Qwen3-Next's key head per value head
    y_grouped = _delta(m, slice(0, 30), batch, snaps)
    want, want_state = ref.delta_rule(m["qkv"], m["beta"], m["alpha"], m["dt_bias"], m["a"], start, *batch, *snaps,
                                      GROUPED, 1e-6)
    np.testing.assert_allclose(y_grouped, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(m["state"], want_state, rtol=1e-4, atol=1e-4)
    assert not np.allclose(y_grouped, y, rtol=1e-2, atol=1e-2)
    rng = np.random.default_rng(6)
    z, w = rng.standard_normal(y.shape).astype(np.float32), rng.uniform(0.5, 1.5, DS).astype(np.float32)
    out = np.empty_like(y)
    head_rmsnorm_gate_kernel(y, z, w, np.float32(1e-6), out)
    np.testing.assert_allclose(out, ref.head_rmsnorm_gate(y, z, w, 1e-6), rtol=1e-4, atol=1e-4)
    qg = rng.standard_normal((3, 4 * 2 * 8)).astype(np.float32)  # 4 heads of 8: [q | gate] each
    q, gate = np.empty((3, 32), np.float32), np.empty((3, 32), np.float32)
    split_gated_q_kernel(qg, 8, q, gate)
    np.testing.assert_array_equal(q, qg.reshape(3, 4, 2, 8)[:, :, 0].reshape(3, 32))
    np.testing.assert_array_equal(gate, qg.reshape(3, 4, 2, 8)[:, :, 1].reshape(3, 32))
    x = q.copy()
    sigmoid_mul_kernel(x, gate)
    np.testing.assert_allclose(x, q / (1.0 + np.exp(-gate.astype(np.float64))), rtol=1e-6)


def test_delta_rule_is_batch_chunk_and_thread_invariant() -> None:
    m = _delta_data(30)
    start = m["state"].copy()
    together = _delta(m, slice(0, 30), _batch([20, 10], [0, 0], [0, 1]))
    after = m["state"].copy()
    m["state"] = start.copy()
    parts = np.concatenate([_delta(m, slice(0, 7), _batch([7], [0], [2])), _delta(m, slice(7, 20), _batch([13], [7], [2]))])
    np.testing.assert_array_equal(parts, together[:20])
    np.testing.assert_array_equal(m["state"][2], after[0])
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]
        m["state"] = start.copy()
        np.testing.assert_array_equal(_delta(m, slice(0, 30), _batch([20, 10], [0, 0], [0, 1])), together)
    finally:
        numba.set_num_threads(before)
