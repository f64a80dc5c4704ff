"""The recurrent layers' kernels against their NumPy twins, and the invariance they keep: a
token's output and its sequence's state are bit-identical alone or batched with other
sequences, in one step or split over several, and for any thread count."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from edge_infer.kernels_cpu import reference_recurrent as ref
from edge_infer.kernels_cpu.recurrent import short_conv_kernel

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
