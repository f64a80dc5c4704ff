"""A context shift's row moves (kernels_cpu.kv_shift): a key stored at position p and moved by
-n reads back as the same key stored at p - n (RoPE rotations compose), in every pool type
(a quantized K is rotated back from its Hadamard form and again); values move unchanged; the
kept rows of the first block are copied as they are."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.attention import store_kv_kernel
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.kernels_cpu.kv_shift import shift_rows


@pytest.mark.parametrize("kv_type", ["f16", "f32", "q8_0", "q4_0", "iq4_nl"])
@pytest.mark.parametrize("neox", [False, True])
def test_moved_keys_read_as_keys_stored_at_their_new_positions(kv_type: str, neox: bool) -> None:
    rng = np.random.default_rng(3)
    n_kv, hd, bs, n_rot = 2, 64, 4, 48
    inv = 10000.0 ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    raw = rng.standard_normal((12, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((12, n_kv * hd)).astype(np.float32)
    pos = np.arange(12)
    moved = CpuBackend.make_kv_pool(None, 1, 8, bs, n_kv, hd, kv_type)[0]  # type: ignore[arg-type]
    store_kv_kernel(ref.rope(raw, n_kv, hd, n_rot, pos, inv, neox), v, np.arange(12, dtype=np.int64), *moved)
    # keep positions 0..5, drop 6..8, move 9..11 to 6..8: blocks 1.. are fresh ones (4, 5)
    moves = [(4, 16, 0), (5, 17, 0)] + [(p + 3, 16 + p - 4, -3) for p in range(6, 9)]
    shift_rows(moved, np.array(moves, np.int64), hd, n_rot, inv, neox)
    direct = CpuBackend.make_kv_pool(None, 1, 8, bs, n_kv, hd, kv_type)[0]  # type: ignore[arg-type]
    new_pos = np.array([4, 5, 6, 7, 8])
    src = np.array([4, 5, 9, 10, 11])
    store_kv_kernel(ref.rope(raw[src], n_kv, hd, n_rot, new_pos, inv, neox), v[src],
                    np.arange(16, 21, dtype=np.int64), *direct)
    k_moved = ref.cache_values(moved[0], moved[1]) if kv_type[0] in "qi" else ref.cache_values(moved[0].transpose(0, 3, 1, 2))
    k_direct = ref.cache_values(direct[0], direct[1]) if kv_type[0] in "qi" else ref.cache_values(direct[0].transpose(0, 3, 1, 2))
    got, want = k_moved[4:6].reshape(8, -1)[:5], k_direct[4:6].reshape(8, -1)[:5]
    # a float pool rounds once more (f16) or not at all; a block type re-quantizes the key
    tol = {"f32": 1e-5, "f16": 4e-3}.get(kv_type, 0.35 if kv_type != "q8_0" else 0.05)
    np.testing.assert_allclose(got, want, atol=tol * np.abs(want).max())
    np.testing.assert_array_equal(moved[2][4:6].reshape(8, -1)[:5], direct[2][4:6].reshape(8, -1)[:5])  # values
    assert np.array_equal(moved[2][1, :2], moved[2][4, :2])  # the kept rows of block 1, copied
