"""Row decoders: bit-exact with the reference dequantizer on random blocks and on real tensors."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REAL_MODELS, real_model_path
from kernel_data import random_rows

from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.quants import dequantize
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import reference as ref


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", dq.KERNEL_TYPES)
def test_decode_row_bit_exact_on_random_blocks(qtype: int) -> None:
    rng = np.random.default_rng(qtype)
    bs = dq.BLOCK_SHAPE[qtype][0]
    cols = max(bs, 32) * 3
    w = random_rows(qtype, 7, cols, rng)
    expect = ref.decode_rows(w, qtype)
    out = np.empty(cols, np.float32)
    for r in range(w.shape[0]):
        dq.decode_row(qtype, w[r], out)
        np.testing.assert_array_equal(_bits(out), _bits(expect[r]))


def test_decode_row_rejects_unknown_type() -> None:
    with pytest.raises(ValueError):
        dq.decode_row(40, np.zeros(18, np.uint8), np.empty(32, np.float32))  # NVFP4: not ours


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_decode_rows_of_every_real_tensor(name: str) -> None:
    """First, middle and last rows of every tensor of the real models decode bit-exactly."""
    with GGUFFile(real_model_path(name)) as f:
        for t in f.tensors.values():
            rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
            w = t.data.reshape(rows, -1)
            full = dequantize(t).reshape(rows, -1)
            out = np.empty(full.shape[1], np.float32)
            for r in sorted({0, rows // 2, rows - 1}):
                dq.decode_row(int(t.type), w[r], out)
                assert np.array_equal(_bits(out), _bits(full[r])), (t.name, r)
