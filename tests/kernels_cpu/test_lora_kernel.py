"""kernels_cpu/lora.py against its NumPy twin, and batch invariance: a row's update is the same
bits alone or in a batch, serial or threaded, with float32 or half-bit adapter arrays."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu import lora, reference
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models.lora_set import LoraRows

K, R = 96, 136  # R: two full column chunks and a short one


def _tables(rng: np.random.Generator, half: bool) -> tuple[np.ndarray, ...]:
    """Three adapter slots: ranks 4, 0 (not on this matrix) and 8; alphas 8, 0, 0."""
    ranks = np.array([4, 0, 8], np.int32)
    off = np.array([0, 4, 4], np.int32)
    alpha = np.array([8.0, 0.0, 0.0], np.float32)
    a = rng.standard_normal((12, K)).astype(np.float32)
    bt = rng.standard_normal((12, R)).astype(np.float32)
    if half:
        a, bt = a.astype(np.float16).view(np.uint16), bt.astype(np.float16).view(np.uint16)
    return off, ranks, alpha, a, bt


CHOICES = [((0, 1.0),), (), ((2, 0.5),), ((0, 0.25), (2, 1.0)), ((1, 1.0),), ((2, -1.0),), ((0, 1.0),)]


def _groups(choices: list[tuple[tuple[int, float], ...]]) -> LoraRows:
    return LoraRows.build(len(choices), [(t, 1, c) for t, c in enumerate(choices) if c])


@pytest.mark.parametrize("half", [False, True])
def test_lora_kernel_matches_reference_and_is_batch_invariant(half: bool) -> None:
    rng = np.random.default_rng(0)
    off, ranks, alpha, a, bt = _tables(rng, half)
    x = rng.standard_normal((len(CHOICES), K)).astype(np.float32)
    base = rng.standard_normal((len(CHOICES), R)).astype(np.float32)
    g = _groups(CHOICES)
    args = (g.row_ptr, g.adapter, g.scale, off, ranks, alpha, a, bt)
    want = reference.lora_add(x, *args, base)
    outs = []
    for parallel in (False, True):
        out = base.copy()
        CpuBackend(2).lora_add(x, *args, out, parallel=parallel)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
        assert np.array_equal(out[1], base[1]) and np.array_equal(out[4], base[4])  # no adapter / rank 0 here
        outs.append(out)
    serial = outs[0]
    assert np.array_equal(outs[1], serial)  # threads change no bit
    for t, c in enumerate(CHOICES):  # each row alone: the same bits
        if not c:
            continue
        g1 = _groups([c])
        solo = base[t : t + 1].copy()
        lora.lora_serial_kernel(x[t : t + 1], g1.row_ptr, g1.adapter, g1.scale, off, ranks, alpha, a, bt, solo)
        assert np.array_equal(solo[0], serial[t]), t


def test_rows_table_and_its_selection() -> None:
    g = LoraRows.build(7, [(0, 3, ((1, 1.0),)), (3, 2, ()), (5, 2, ((1, 2.0), (0, 0.5)))])
    assert g.row_ptr.tolist() == [0, 1, 2, 3, 3, 3, 5, 7]
    assert g.adapter.tolist() == [1, 1, 1, 0, 1, 0, 1] and g.scale.tolist() == [1, 1, 1, 0.5, 2, 0.5, 2]  # slot order
    s = g.select(np.array([6, 4, 2]))
    assert s.row_ptr.tolist() == [0, 2, 2, 3] and s.adapter.tolist() == [0, 1, 1] and s.scale.tolist() == [0.5, 2, 1]


def test_lora_scale_is_llama_cpps() -> None:
    """alpha != 0: scale * alpha / rank in float32; alpha 0: the scale alone."""
    rng = np.random.default_rng(1)
    off, ranks, alpha, a, bt = _tables(rng, False)
    x = rng.standard_normal((1, K)).astype(np.float32)
    for slot, s in ((0, 0.7), (2, 0.7)):
        out = np.zeros((1, R), np.float32)
        g = _groups([((slot, s),)])
        CpuBackend(2).lora_add(x, g.row_ptr, g.adapter, g.scale, off, ranks, alpha, a, bt, out, parallel=False)
        rows = slice(off[slot], off[slot] + ranks[slot])
        delta = bt[rows].astype(np.float64).T @ (a[rows].astype(np.float64) @ x[0].astype(np.float64))
        factor = np.float32(np.float32(s) * alpha[slot] / np.float32(ranks[slot])) if alpha[slot] else np.float32(s)
        np.testing.assert_allclose(out[0], factor * delta, rtol=1e-4, atol=1e-4)
