"""The IQ2/IQ3 and IQ1 grid quantizers (formats/quantizers_grid.py, quantizers_iq1.py) write
llama-quantize's bytes: ggml's `ggml_quantize_chunk` on the same rows and importance matrix,
byte for byte."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from support.quant_helpers import ggml_quantize_chunk

from edge_infer.errors import EdgeInferError
from edge_infer.formats.grid_lattice import lattice
from edge_infer.formats.quantizers_grid import GRID_QUANTIZED
from edge_infer.formats.quants import BLOCK_LAYOUTS, dequantize_blocks, quantize

ROWS, COLS = 6, 1536
WRITTEN = (*GRID_QUANTIZED, T.IQ1_S, T.IQ1_M)


@pytest.fixture(scope="module")
def chunk() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    return ggml_quantize_chunk()


def _ggml(fn: ctypes._CFuncPtr, x: np.ndarray, t: T, imp: np.ndarray | None) -> np.ndarray:  # type: ignore[name-defined]
    lay = BLOCK_LAYOUTS[t]
    out = np.zeros((x.shape[0], x.shape[1] // 256 * lay.type_size), np.uint8)
    fn(int(t), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None if imp is None else imp.ctypes.data)
    return out


def _weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed rows with one dead super-block, and an importance with dead channels."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(4, (ROWS, COLS)) * 0.03).astype(np.float32)
    x[1, 256:512] = 0
    imp = (rng.gamma(0.5, 2.0, COLS)).astype(np.float32)
    imp[rng.random(COLS) < 0.05] = 0
    return x, imp


@pytest.mark.parametrize("t", WRITTEN, ids=lambda t: t.name)
def test_grid_quantizers_write_ggml_bytes_under_an_importance_matrix(chunk: ctypes._CFuncPtr, t: T) -> None:  # type: ignore[name-defined]
    x, imp = _weights(int(t))
    ours = quantize(x, t, imp)
    assert np.array_equal(ours, _ggml(chunk, x, t, imp))
    if not BLOCK_LAYOUTS[t].needs_importance:
        assert np.array_equal(quantize(x, t), _ggml(chunk, x, t, None))
    y = dequantize_blocks(ours, t, x.size).reshape(x.shape)
    rel = np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2))
    assert rel < (0.8 if t in (T.IQ1_S, T.IQ1_M) else 0.6), rel  # 1.6-3 bits per weight; the bytes are the real check


@pytest.mark.parametrize("t", [T.IQ1_S, T.IQ1_M], ids=lambda t: t.name)
def test_iq1_ties_are_split_as_ggml_splits_them(chunk: ctypes._CFuncPtr, t: T) -> None:  # type: ignore[name-defined]
    """A requantized file's values repeat (a 4-bit source has 16 per block): IQ1's exhaustive
    split search sorts them, and equal values keep their order (glibc's stable qsort, our
    mergesort), so the bytes still agree."""
    rng = np.random.default_rng(5)
    x = (rng.integers(-7, 8, (ROWS, COLS)) * 0.01).astype(np.float32)
    imp = rng.gamma(0.5, 2.0, COLS).astype(np.float32)
    assert np.array_equal(quantize(x, t, imp), _ggml(chunk, x, t, imp))


@pytest.mark.parametrize("t", [t for t in WRITTEN if BLOCK_LAYOUTS[t].needs_importance], ids=lambda t: t.name)
def test_iq2_xxs_xs_and_iq1_s_need_an_importance_matrix(t: T) -> None:
    with pytest.raises(EdgeInferError, match=rf"quantize to {t.name}: this type needs an importance matrix \(--imatrix"):
        quantize(np.ones((2, 256), np.float32), t)


def test_the_importance_is_checked() -> None:
    x = np.ones((2, 512), np.float32)
    with pytest.raises(EdgeInferError, match="importance must be 512 finite non-negative values"):
        quantize(x, T.IQ2_XS, np.ones(256, np.float32))
    with pytest.raises(EdgeInferError, match="row length 300 is not a multiple of the block size 256"):
        quantize(np.ones((2, 300), np.float32), T.IQ3_S)


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"])
def test_lattice_neighbours_are_the_nearest_entries(name: str) -> None:
    """Every codebook entry maps to itself; an off-codebook point's neighbours include every
    entry at its smallest distance, in index order among equals."""
    lat = lattice(name)
    shifts = lat.level_bits * np.arange(lat.width)
    keys = (lat.levels.astype(np.int64) << shifts).sum(axis=1)
    assert np.array_equal(lat.code_of[keys], np.arange(len(keys)))
    rng = np.random.default_rng(0)
    pts = rng.integers(0, lat.n_levels, (200, lat.width))
    for p, u in zip(pts, (pts << shifts).sum(axis=1), strict=True):
        if lat.code_of[u] >= 0:
            continue
        d2 = (((2 * p + 1) - (2 * lat.levels.astype(np.int64) + 1)) ** 2).sum(axis=1)
        near = lat.near[lat.near_start[u] : lat.near_start[u] + lat.near_count[u]]
        closest = np.flatnonzero(d2 == d2.min())
        assert np.array_equal(near[: len(closest)], closest)
        assert (np.diff(d2[near]) >= 0).all()
