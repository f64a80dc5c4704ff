"""Block layouts, dequantize and quantize: bit-exact against gguf-py and, where llama-cpp-python
ships libggml-base, against ggml's own C reference; round-trip error bounds; the real models."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import conftest
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf import GGMLQuantizationType as T
from gguf import quants as gq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.quant_helpers import ggml_base

from edge_infer.errors import EdgeInferError, UnsupportedTensorType
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.quants import BLOCK_LAYOUTS, SUPPORTED_TYPES, dequantize, dequantize_blocks, quantize

ALL_TYPES = list(BLOCK_LAYOUTS)
QUANTIZABLE = [t for t in ALL_TYPES if BLOCK_LAYOUTS[t].quantizer]  # the types we encode
# ... without an importance matrix (IQ2_XXS, IQ2_XS need one: tests/formats/test_quantizers_grid.py)
PLAIN_QUANTIZABLE = [t for t in QUANTIZABLE if not BLOCK_LAYOUTS[t].needs_importance]
BLOCK_TYPES = [t for t in PLAIN_QUANTIZABLE if BLOCK_LAYOUTS[t].block_size > 1]
GGUF_PY_DEQUANT = [t for t in ALL_TYPES if t != T.Q8_K]  # gguf-py has no Q8_K
SIGNED_GRIDS = (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S)
GGUF_PY_QUANT = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]

# f16 bit patterns: ±0, smallest/largest subnormal, smallest normal, ±1, ±largest finite
F16_EDGES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]
F32_EDGES = [0x00000000, 0x80000000, 0x00000001, 0x00800000, 0x3F800000, 0x7F7FFFFF, 0xFF7FFFFF]


def bits(a: np.ndarray) -> np.ndarray:
    """float32 values as uint32 bit patterns, so NaN and -0 compare exactly."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def gguf_py_dequant(raw: np.ndarray, qtype: T) -> np.ndarray:
    lay = BLOCK_LAYOUTS[qtype]
    return gq.dequantize(raw.reshape(-1, lay.type_size), qtype).reshape(-1)


# -- ggml's C reference, from llama-cpp-python's bundled libggml-base -------------------------
_ggml_base = ggml_base


@pytest.fixture(scope="module")
def ggml() -> ctypes.CDLL:
    lib = _ggml_base()
    if lib is None:
        pytest.skip("llama-cpp-python's libggml-base is not installed")
    return lib


def _c_name(qtype: T) -> str:
    return qtype.name.lower().replace("_k", "_K")  # q4_0, q4_K


# types whose `quantize_row_*_ref` is not what llama-quantize writes (IQ4_NL's tries no other
# scales): these compare with ggml_quantize_chunk without an importance matrix, its path
GRID_TYPES = (T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_M)  # the grid types written without an importance matrix
CHUNK_QUANTIZED = (T.IQ4_NL, T.IQ4_XS, *GRID_TYPES)  # ggml_quantize_chunk inits the grids


def c_quantize(lib: ctypes.CDLL, x: np.ndarray, qtype: T) -> np.ndarray:
    lay = BLOCK_LAYOUTS[qtype]
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.zeros(x.size // lay.block_size * lay.type_size, np.uint8)  # Q8_K leaves bsums unset on 0 blocks
    if qtype in CHUNK_QUANTIZED:
        chunk = lib.ggml_quantize_chunk
        chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_int64, ctypes.c_void_p]
        chunk.restype = ctypes.c_size_t
        chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, 1, x.size, None)
        return out
    fn = getattr(lib, f"quantize_row_{_c_name(qtype)}_ref")
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out


def c_dequantize(lib: ctypes.CDLL, raw: np.ndarray, qtype: T) -> np.ndarray:
    lay = BLOCK_LAYOUTS[qtype]
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.size // lay.type_size * lay.block_size
    out = np.empty(n, np.float32)
    name = {T.F16: "ggml_fp16_to_fp32_row", T.BF16: "ggml_bf16_to_fp32_row"}.get(
        qtype, f"dequantize_row_{_c_name(qtype)}"
    )
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    fn(raw.ctypes.data, out.ctypes.data, n)
    return out


# -- layouts ----------------------------------------------------------------------------------
def test_layouts_match_ggml_sizes() -> None:
    assert set(SUPPORTED_TYPES) == set(BLOCK_LAYOUTS)
    for t, lay in BLOCK_LAYOUTS.items():
        assert lay.name == t.name
        assert (lay.block_size, lay.type_size) == GGML_QUANT_SIZES[t], t.name
        assert lay.dtype.itemsize == lay.type_size, t.name


# -- dequantize: random blocks ----------------------------------------------------------------
@st.composite
def raw_blocks(draw: st.DrawFn, qtype: T) -> np.ndarray:
    """1-6 random blocks; often with every scale pinned to an edge value and the quants all
    0x00 or all 0xFF (the smallest and largest codes)."""
    lay = BLOCK_LAYOUTS[qtype]
    nb = draw(st.integers(1, 6))
    raw = np.frombuffer(
        draw(st.binary(min_size=nb * lay.type_size, max_size=nb * lay.type_size)), np.uint8
    ).copy()
    if lay.dtype.names is None:
        return raw
    blocks = raw.view(lay.dtype)
    for name in lay.dtype.names:
        ft = lay.dtype.fields[name][0]
        base = ft.base if ft.subdtype else ft
        if base.kind == "f" and draw(st.booleans()):
            edges = F16_EDGES if base.itemsize == 2 else F32_EDGES
            pattern = [draw(st.sampled_from(edges)) for _ in range(nb)]
            blocks[name] = np.array(pattern, np.uint16 if base.itemsize == 2 else np.uint32).view(base)
        elif base.itemsize == 1:
            fill = draw(st.sampled_from(["random", "min", "max"]))
            if fill != "random":
                blocks[name] = np.array(0 if fill == "min" else 0xFF, np.uint8).view(base)
    return raw


@pytest.mark.parametrize("qtype", GGUF_PY_DEQUANT, ids=lambda t: t.name)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_dequantize_random_blocks_bit_exact_with_gguf_py(qtype: T, data: st.DataObject) -> None:
    raw = data.draw(raw_blocks(qtype))
    n = raw.size // BLOCK_LAYOUTS[qtype].type_size * BLOCK_LAYOUTS[qtype].block_size
    with np.errstate(all="ignore"):
        ref = gguf_py_dequant(raw, qtype)
    ours = dequantize_blocks(raw, qtype, n)
    assert ours.dtype == np.float32 and ours.shape == (n,)
    assert np.array_equal(bits(ours), bits(ref))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_many_random_blocks_bit_exact_with_c(ggml: ctypes.CDLL, qtype: T) -> None:
    lay = BLOCK_LAYOUTS[qtype]
    raw = np.random.default_rng(int(qtype)).integers(0, 256, 2048 * lay.type_size, dtype=np.uint8)
    ours = dequantize_blocks(raw, qtype, 2048 * lay.block_size)
    if qtype == T.F32:
        ref = raw.view(np.float32)
    else:
        ref = c_dequantize(ggml, raw, qtype)
    got, want = bits(ours), bits(ref)
    if qtype == T.F16:
        # ggml's f16 -> f32 quiets signalling NaNs; NumPy (and so gguf-py, which we follow) keeps them
        got = np.where(np.isnan(ours), got | 0x00400000, got)
    if qtype in SIGNED_GRIDS:
        # a sign bit: gguf-py (whom we follow) multiplies by -1, ggml's compiled code negates,
        # so a NaN (from a NaN scale) comes out with either sign
        nan = np.isnan(ours) & np.isnan(ref)
        got, want = np.where(nan, 0, got), np.where(nan, 0, want)
    assert np.array_equal(got, want)


def test_q8_k_dequantize_is_d_times_q() -> None:
    lay = BLOCK_LAYOUTS[T.Q8_K]
    raw = np.random.default_rng(5).integers(0, 256, 64 * lay.type_size, dtype=np.uint8)
    b = raw.view(lay.dtype)
    b["d"] = np.random.default_rng(6).standard_normal(64).astype(np.float32)
    want = b["d"][:, None] * b["qs"].astype(np.float32)
    assert np.array_equal(bits(dequantize_blocks(raw, T.Q8_K, 64 * 256)), bits(want).reshape(-1))


# -- dequantize: tensors and errors -----------------------------------------------------------
def fake_tensor(name: str, qtype: T, shape: tuple[int, ...], data: np.ndarray) -> TensorInfo:
    return TensorInfo(name, qtype, shape, 0, data.size, data)


def test_dequantize_tensor_shape_is_gguf_shape_reversed() -> None:
    x = np.random.default_rng(0).standard_normal((3, 2, 64)).astype(np.float32)
    raw = quantize(x, T.Q8_0).reshape(-1)
    out = dequantize(fake_tensor("w", T.Q8_0, (64, 2, 3), raw))
    assert out.shape == (3, 2, 64) and out.dtype == np.float32
    assert np.array_equal(bits(out), bits(gguf_py_dequant(raw, T.Q8_0).reshape(3, 2, 64)))
    f32 = dequantize(fake_tensor("n", T.F32, (64, 6), x.view(np.uint8).reshape(-1)))
    assert np.array_equal(f32, x.reshape(6, 64))


@pytest.mark.parametrize("qtype", [T.NVFP4, T.Q1_0, T.Q8_1, T.I8])
def test_unsupported_type_names_tensor_and_type(qtype: T) -> None:
    block, size = GGML_QUANT_SIZES[qtype]
    t = fake_tensor("blk.0.attn_q.weight", qtype, (block * 2, 3), np.zeros(6 * size, np.uint8))
    with pytest.raises(UnsupportedTensorType, match=rf"'blk\.0\.attn_q\.weight'.*{qtype.name}"):
        dequantize(t)
    with pytest.raises(UnsupportedTensorType, match=qtype.name):
        dequantize_blocks(t.data, qtype, block * 6)
    with pytest.raises(UnsupportedTensorType, match=qtype.name):
        quantize(np.zeros((3, block * 2), np.float32), qtype)


@pytest.mark.parametrize("qtype", [t for t in ALL_TYPES if t not in QUANTIZABLE], ids=lambda t: t.name)
def test_types_read_but_not_written_say_so(qtype: T) -> None:
    with pytest.raises(UnsupportedTensorType, match=rf"quantize to {qtype.name}: .*llama-quantize"):
        quantize(np.zeros((2, 256), np.float32), qtype)


def test_bad_sizes_raise_edge_infer_error() -> None:
    with pytest.raises(EdgeInferError, match="need 68 bytes, got 67"):
        dequantize_blocks(np.zeros(67, np.uint8), T.Q8_0, 64)
    with pytest.raises(EdgeInferError, match="not a whole number"):
        dequantize_blocks(np.zeros(34, np.uint8), T.Q8_0, 33)
    with pytest.raises(EdgeInferError, match="row length 48 is not a multiple of the block size 32"):
        quantize(np.zeros((2, 48), np.float32), T.Q4_0)


# -- quantize ---------------------------------------------------------------------------------
# Finite values whose block scales stay finite and invertible: 0, or 1e-30 <= |x| <= 1e30.
_TINY, _HUGE = float(np.float32(1e-30)), float(np.float32(1e30))
_finite = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, -0.5]),
    st.floats(_TINY, _HUGE, width=32),
    st.floats(-_HUGE, -_TINY, width=32),
    st.integers(-300, 300).map(lambda i: i / 8),  # exact halves and quarters: rounding ties
)


def float_rows(block: int, max_blocks: int = 3) -> st.SearchStrategy[np.ndarray]:
    shape = st.tuples(st.integers(1, 3), st.integers(1, max_blocks).map(lambda k: k * block))
    return hnp.arrays(np.float32, shape, elements=_finite)


@pytest.mark.parametrize("qtype", GGUF_PY_QUANT, ids=lambda t: t.name)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_quantize_bit_exact_with_gguf_py(qtype: T, data: st.DataObject) -> None:
    x = data.draw(float_rows(max(BLOCK_LAYOUTS[qtype].block_size, 32)))
    with np.errstate(all="ignore"):
        ref = np.ascontiguousarray(gq.quantize(x, qtype)).view(np.uint8)
    ours = quantize(x, qtype)
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_quantize_bit_exact_with_c_reference(ggml: ctypes.CDLL, qtype: T, data: st.DataObject) -> None:
    x = data.draw(float_rows(BLOCK_LAYOUTS[qtype].block_size, max_blocks=2))
    if data.draw(st.booleans()):  # dense, realistic blocks; sometimes with an all-zero sub-block
        x = (
            np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
            .standard_normal(x.shape)
            .astype(np.float32)
        )
        x[..., : data.draw(st.sampled_from([0, 16, 32]))] = 0
    if qtype in GRID_TYPES:  # ggml aborts when a weighted squared distance overflows to inf
        x = np.clip(x, -1e6, 1e6)
    if qtype in (T.Q4_0, T.Q5_0):
        # we follow gguf-py, which takes the scale's sign from a -0.0 in an all-zero block; the
        # C loop starts from +0 instead (a difference only in the sign bit of d = 0)
        x = x + np.float32(0)
    ours, ref = quantize(x, qtype).reshape(-1), c_quantize(ggml, x, qtype)
    if qtype == T.IQ3_S:
        # ggml's IQ3_S does not move its output on past an all-zero 32-value block (the later
        # blocks' codes land one block early): compare the super-blocks without one
        lay = BLOCK_LAYOUTS[qtype]
        ok = ~(x.reshape(-1, 8, 32) == 0).all(axis=2).any(axis=1)
        ours, ref = ours.reshape(-1, lay.type_size)[ok], ref.reshape(-1, lay.type_size)[ok]
    assert np.array_equal(ours, ref)


def _data_sets() -> Iterator[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    yield "normal", rng.standard_normal((16, 1024)).astype(np.float32)
    yield "student-t3", rng.standard_t(3, (16, 1024)).astype(np.float32)


# (worst |x - x'| / max|x| within one block (>= 32 elements), RMS(x - x') / RMS(x)); the first is
# the format's own bound where it has a simple one (Q4_0 reaches a full step: +max codes only to +7)
ROUND_TRIP_BOUNDS = {
    T.F32: (0, 0),
    T.F16: (2**-11, 3e-4),
    T.BF16: (2**-8, 2.5e-3),
    T.Q8_0: (0.0045, 0.01),
    T.Q8_K: (1 / 254, 0.021),
    T.Q4_0: (0.126, 0.15),
    T.Q4_1: (0.068, 0.12),
    T.Q5_0: (0.063, 0.08),
    T.Q5_1: (0.034, 0.06),
    T.Q2_K: (0.4, 0.42),
    T.Q3_K: (0.25, 0.23),
    T.Q4_K: (0.09, 0.11),
    T.Q5_K: (0.05, 0.056),
    T.Q6_K: (0.02, 0.03),
    T.IQ4_NL: (0.12, 0.11),
    T.IQ4_XS: (0.32, 0.11),  # a block far below its super-block's largest gets a coarse 6-bit scale
    # the grid types without an importance matrix weigh each value by x^2: large values win
    T.IQ2_S: (0.65, 0.45),
    T.IQ3_XXS: (0.55, 0.32),
    T.IQ3_S: (0.42, 0.24),
    T.IQ1_M: (1.2, 0.7),  # 1.75 bits per weight: a value can land at the other end of its 3 levels
}


@pytest.mark.parametrize("qtype", PLAIN_QUANTIZABLE, ids=lambda t: t.name)
def test_round_trip_error_is_bounded(qtype: T) -> None:
    worst_bound, rms_bound = ROUND_TRIP_BOUNDS[qtype]
    lay = BLOCK_LAYOUTS[qtype]
    for name, x in _data_sets():
        q = quantize(x, qtype)
        assert q.shape == (16, 1024 // lay.block_size * lay.type_size)
        y = dequantize_blocks(q, qtype, x.size).reshape(x.shape)
        group = max(lay.block_size, 32)
        err, xb = (y - x).reshape(-1, group), x.reshape(-1, group)
        worst = (np.abs(err).max(axis=1) / np.abs(xb).max(axis=1)).max()
        rms = np.sqrt(np.mean(err.astype(np.float64) ** 2) / np.mean(x.astype(np.float64) ** 2))
        assert worst <= worst_bound * 1.0001, (name, worst)
        assert rms <= rms_bound, (name, rms)


def test_q8_k_bsums_and_zero_blocks() -> None:
    x = np.random.default_rng(9).standard_normal((3, 256)).astype(np.float32)
    x[1] = 0
    b = quantize(x, T.Q8_K).reshape(-1).view(BLOCK_LAYOUTS[T.Q8_K].dtype)
    assert np.array_equal(b["bsums"], b["qs"].reshape(3, 16, 16).sum(axis=2))
    assert b["d"][1] == 0 and not b["qs"][1].any()
    assert np.abs(b["qs"]).max() == 127


def test_quantize_keeps_leading_dims_and_accepts_other_dtypes() -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 256))
    q = quantize(x, T.Q4_K)
    assert q.shape == (2, 3, 144)
    assert np.array_equal(q, quantize(x.astype(np.float32), T.Q4_K))


# -- the real models (slow) -------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_pair(any_real_model: Path) -> Iterator[tuple[GGUFFile, GGUFReader]]:
    opener = getattr(conftest, "gguf_py_reader", None)  # session-wide cache, when conftest has it
    reader = opener(any_real_model) if opener else GGUFReader(str(any_real_model))
    with GGUFFile(any_real_model) as f:
        yield f, reader


ROW_STRIDE = 4  # of a real matrix's rows, every 4th and the last are compared (all of a vector)


@pytest.mark.slow
def test_every_tensor_of_the_real_models_dequantizes_like_gguf_py(
    model_pair: tuple[GGUFFile, GGUFReader],
) -> None:
    """Every tensor, through the same row selection on both sides: every block position of a
    row and every part of the file, where the whole tensors took 150 s of CI for the same
    decoders (each type's every block form is covered by the random-block tests above)."""
    f, reader = model_pair
    assert len(reader.tensors) == len(f.tensors)
    for rt in reader.tensors:
        t = f.tensors[rt.name]
        row_len, n_rows = t.numpy_shape[-1], t.n_elements // t.numpy_shape[-1]
        rows = np.unique(np.r_[np.arange(0, n_rows, ROW_STRIDE), n_rows - 1])
        ours = dequantize_blocks(np.asarray(t.data).reshape(n_rows, -1)[rows], t.type, rows.size * row_len)
        ref = gq.dequantize(np.asarray(rt.data).reshape(n_rows, -1)[rows], rt.tensor_type).reshape(-1)
        assert tuple(reversed([int(n) for n in rt.shape])) == t.numpy_shape, rt.name
        assert ours.shape == ref.shape == (rows.size * row_len,), rt.name
        assert np.array_equal(bits(ours), bits(ref)), rt.name
        del ours, ref
