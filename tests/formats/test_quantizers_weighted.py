"""Importance-weighted quantizers: the compiled fits equal their NumPy twins, and every type's
weighted error is as low as ggml's own imatrix quantizer gets it (llama-cpp-python's
libggml-base, `ggml_quantize_chunk` with quant weights) and well below round-to-nearest."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from support.quant_helpers import ggml_base

from edge_infer.errors import EdgeInferError
from edge_infer.formats.quant_fit import fit_affine_kernel, fit_symmetric_kernel
from edge_infer.formats.quantizers_weighted import WEIGHTED_QUANTIZERS, fit_affine, fit_symmetric
from edge_infer.formats.quants import BLOCK_LAYOUTS, dequantize_blocks, quantize

RNG = np.random.default_rng(11)
X = (RNG.standard_t(4, (48, 1024)) * 0.02).astype(np.float32)  # heavy tails, like real weights
IMP = (RNG.gamma(0.5, 1.0, 1024) ** 2).astype(np.float32)  # a few channels matter much more


def _err(x: np.ndarray, w: np.ndarray, d: np.ndarray, m: np.ndarray, L: np.ndarray) -> np.ndarray:
    """Each block's weighted squared error of x ~ d * L - m (float64)."""
    y = d[:, None].astype(np.float64) * L - m[:, None]
    return (w * (y - x) ** 2).sum(axis=1)


@pytest.mark.parametrize("n, nmax", [(16, 4), (16, 32), (32, 8), (32, 16)])
def test_symmetric_kernel_equals_its_twin(n: int, nmax: int) -> None:
    x = X.reshape(-1, n)[:2000].copy()  # X stays as it is for the other tests
    w = np.random.default_rng(n * 100 + nmax).random(x.shape).astype(np.float32)  # whatever ran before
    x[3] = 0  # an all-zero block
    d0, L0 = fit_symmetric(x, w, nmax)
    d1, L1 = np.empty(len(x), np.float32), np.empty(x.shape, np.int32)
    fit_symmetric_kernel(x, w, nmax, 9, d1, L1, 2)
    same = (d0 == d1) & (L0 == L1).all(axis=1)
    assert same.mean() > 0.995  # sums in another order: rare ties, which must be ties
    np.testing.assert_allclose(_err(x, w, d1, 0 * d1, L1)[~same], _err(x, w, d0, 0 * d0, L0)[~same], rtol=1e-5)


@pytest.mark.parametrize("n, nmax", [(16, 3), (32, 15), (32, 31)])
def test_affine_kernel_equals_its_twin(n: int, nmax: int) -> None:
    x = X.reshape(-1, n)[:2000].copy()
    w = np.random.default_rng(n * 100 + nmax).random(x.shape).astype(np.float32)
    x[5] = 0.25  # a flat block
    d0, m0, L0 = fit_affine(x, w, nmax)
    d1, m1, L1 = np.empty(len(x), np.float32), np.empty(len(x), np.float32), np.empty(x.shape, np.int32)
    fit_affine_kernel(x, w, nmax, 36, d1, m1, L1, 2)
    same = (d0 == d1) & (m0 == m1) & (L0 == L1).all(axis=1)
    # a tie: e.g. a block whose codes are all 0 or nmax is fit as well by other scales
    assert same.mean() > 0.995
    np.testing.assert_allclose(_err(x, w, d1, m1, L1)[~same], _err(x, w, d0, m0, L0)[~same], rtol=1e-5)
    assert (m1 >= 0).all() and L1.min() >= 0 and L1.max() <= nmax


def _ggml_imatrix(lib: ctypes.CDLL, x: np.ndarray, qtype: T, imp: np.ndarray) -> np.ndarray:
    lay = BLOCK_LAYOUTS[qtype]
    out = np.zeros(x.size // lay.block_size * lay.type_size, np.uint8)
    fn = lib.ggml_quantize_chunk
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    fn(int(qtype), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], imp.ctypes.data)
    return out


def _error(raw: np.ndarray, qtype: T) -> float:
    y = dequantize_blocks(raw, qtype, X.size).reshape(X.shape)
    return float((((y - X) ** 2) * IMP).sum())


@pytest.mark.parametrize("qtype", list(WEIGHTED_QUANTIZERS), ids=lambda t: t.name)
def test_weighted_error_matches_ggml_imatrix_quantizer(qtype: T) -> None:
    lib = ggml_base()
    if lib is None:
        pytest.skip("llama-cpp-python's libggml-base is not installed")
    ours = _error(quantize(X, qtype, IMP), qtype)
    ggml = _error(_ggml_imatrix(lib, X, qtype, IMP), qtype)
    rtn = _error(quantize(X, qtype), qtype)
    assert ours <= 1.05 * ggml, (ours, ggml)
    assert ours < 0.8 * rtn, (ours, rtn)


def test_importance_is_validated() -> None:
    with pytest.raises(EdgeInferError, match="1024 finite non-negative values, got 3"):
        quantize(X, T.Q4_K, np.ones(3, np.float32))
    with pytest.raises(EdgeInferError, match="finite non-negative"):
        quantize(X, T.Q4_K, -IMP)
    assert np.array_equal(quantize(X, T.Q8_0, IMP), quantize(X, T.Q8_0))  # no weighted form: the reference
