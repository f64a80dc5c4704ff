"""LFM2-VL preprocessing against llama.cpp's libmtmd on a tiny lfm2 mmproj (tests/support/
tiny_vlm.py, patch 16, merge 2 and one layer, so 512x512 tiles are 32x32 patches and the oracle stays fast):
the exact float32 planes the vision encoder saw, in its order (tiles row by row, then the
thumbnail), for single-tile sizes (upscaled, odd, extreme aspect, the max-pixels branch) and
tiled ones, with mtmd's default token limits and with custom ones. Then the position-embedding
resize: bit for bit against ggml_interpolate itself (ggml's CPU library through ctypes, the ops
clip_graph::resize_position_embeddings builds) and close to a float64 reference."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from mtmd_oracle import MtmdOracle
from tiny_vlm import test_image, write_tiny_vlm

from edge_infer.images.preprocess import ImageTiles
from edge_infer.images.preprocess_lfm2 import grid_layout, lfm2_tiles, should_tile, smart_size
from edge_infer.models.vision_positions import resize_positions

PATCH, MERGE, IMAGE = 16, 2, 128
MEAN = STD = (0.5, 0.5, 0.5)  # tiny_vlm's defaults
# (width, height) -> grid (cols, rows); (0, 0): one smart-resized tile
SIZES = {
    (150, 100): (0, 0),  # below min tokens: scaled up
    (37, 23): (0, 0),
    (5, 300): (0, 0),  # an edge rounds to 0 and is floored at one merged patch
    (333, 211): (0, 0),
    (600, 600): (0, 0),  # above max tokens: scaled down (600 / beta lands on 512.0 exactly)
    (720, 720): (0, 0),  # tiling's rounding is to even: 22.5 patches -> 22, not tiled
    (1100, 700): (3, 2),  # fitted into 1536x1024 with black bars
    (700, 1300): (1, 2),
    (1100, 1100): (3, 3),  # 2x2 and 3x3 tie on aspect; the area picks 3x3
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_vlm(tmp_path_factory.mktemp("lfm2"), "lfm2", patch_size=PATCH, image_size=IMAGE, n_layer=1)


@pytest.fixture(scope="module")
def oracle(files: tuple[Path, Path]) -> Iterator[MtmdOracle]:
    with MtmdOracle(*files, flash_attn=False, n_threads=1) as o:  # one thread: far faster on busy CPUs
        yield o


def _check_planes(o: MtmdOracle, w: int, h: int, ours: ImageTiles) -> list[int]:
    """Ours equals mtmd's planes exactly, in order; returns mtmd's image chunk token counts."""
    chunks = [c for c in o.chunks(f"Look: {o.marker}", [test_image(w, h, seed=w + h)]) if c.kind == "image"]
    theirs = [p for c in chunks for p in o.pixels(c)]
    planes = [*ours.tiles, *([] if ours.overview is None else [ours.overview])]
    assert [p.shape for p in planes] == [p.shape for p in theirs]
    for i, (a, b) in enumerate(zip(planes, theirs, strict=True)):
        assert a.dtype == np.float32 and np.array_equal(a, b), f"{w}x{h} plane {i}: max |diff| {np.abs(a - b).max()}"
    return [c.n_tokens for c in chunks]


@pytest.mark.parametrize(("w", "h"), list(SIZES))
def test_pixels_match_mtmd(oracle: MtmdOracle, w: int, h: int) -> None:
    ours = lfm2_tiles(test_image(w, h, seed=w + h), IMAGE, PATCH, MERGE, MEAN, STD)
    cols, rows = SIZES[w, h]
    assert ours.grid == (cols, rows)
    n_tokens = _check_planes(oracle, w, h, ours)
    merged = PATCH * MERGE
    if cols == 0:
        assert ours.overview is None and len(ours.tiles) == 1
        tile = ours.tiles[0]
        assert n_tokens == [tile.shape[1] // merged * (tile.shape[2] // merged)]
        assert 64 <= n_tokens[0] <= 256
    else:
        assert ours.overview is not None and len(ours.tiles) == cols * rows
        assert all(t.shape == (3, 512, 512) for t in ours.tiles)
        assert n_tokens[:-1] == [(512 // merged) ** 2] * (cols * rows)


@pytest.mark.parametrize(("w", "h"), [(150, 100), (300, 200), (64, 64)])
def test_pixels_match_mtmd_custom_token_limits(files: tuple[Path, Path], w: int, h: int) -> None:
    with MtmdOracle(*files, flash_attn=False, n_threads=1, image_min_tokens=16, image_max_tokens=32) as o:
        ours = lfm2_tiles(test_image(w, h, seed=w + h), IMAGE, PATCH, MERGE, MEAN, STD, 16, 32)
        assert ours.grid == (0, 0)
        assert 16 <= _check_planes(o, w, h, ours)[0] <= 32


def test_size_rules() -> None:
    align = PATCH * MERGE
    assert smart_size(150, 100, align, 64 * align**2, 256 * align**2) == (320, 224)
    assert smart_size(600, 600, align, 64 * align**2, 256 * align**2) == (512, 512)
    # 720 / 32 = 22.5: std::nearbyint takes it to 22 (704^2 < 2 * max), 724 rounds to 23
    assert not should_tile(720, 720, PATCH, align, 256 * align**2)
    assert should_tile(724, 724, PATCH, align, 256 * align**2)
    assert should_tile(1100, 700, PATCH, align, 256 * align**2)
    assert grid_layout(1030, 1030) == (2, 2) and grid_layout(1100, 1100) == (3, 3)
    assert grid_layout(1600, 800) == (4, 2) and grid_layout(1000, 500) == (2, 1)


# ---- position embeddings ------------------------------------------------------------------


def _ggml_resize(table: np.ndarray, width: int, height: int) -> np.ndarray:
    """resize_position_embeddings' ops (reshape, permute, ggml_interpolate bilinear +
    antialias, permute, cont) run by the ggml CPU library llama-cpp-python ships."""
    lc = pytest.importorskip("llama_cpp")
    lib = os.path.join(os.path.dirname(lc.__file__), "lib")
    base, cpu = ctypes.CDLL(os.path.join(lib, "libggml-base.so")), ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"))

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    vp, i64, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for name, res, args in (("ggml_init", vp, [InitParams]), ("ggml_new_tensor_2d", vp, [vp, ci, i64, i64]),
                            ("ggml_reshape_3d", vp, [vp, vp, i64, i64, i64]),
                            ("ggml_permute", vp, [vp, vp, ci, ci, ci, ci]),
                            ("ggml_interpolate", vp, [vp, vp, i64, i64, i64, i64, ctypes.c_uint32]),
                            ("ggml_cont_2d", vp, [vp, vp, i64, i64]), ("ggml_new_graph", vp, [vp]),
                            ("ggml_build_forward_expand", None, [vp, vp]), ("ggml_get_data", vp, [vp]),
                            ("ggml_free", None, [vp])):
        getattr(base, name).restype, getattr(base, name).argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype, cpu.ggml_graph_compute_with_ctx.argtypes = ci, [vp, vp, ci]

    nn, d = table.shape
    n = int(round(nn**0.5))
    src = np.ascontiguousarray(table, np.float32)
    ctx = base.ggml_init(InitParams(64 << 20, None, False))
    try:
        t = base.ggml_new_tensor_2d(ctx, 0, d, nn)  # GGML_TYPE_F32
        ctypes.memmove(base.ggml_get_data(t), src.ctypes.data, src.nbytes)
        x = base.ggml_permute(ctx, base.ggml_reshape_3d(ctx, t, d, n, n), 2, 0, 1, 3)
        x = base.ggml_interpolate(ctx, x, width, height, d, 1, 1 | 1 << 9)  # BILINEAR | FLAG_ANTIALIAS
        x = base.ggml_cont_2d(ctx, base.ggml_permute(ctx, x, 1, 2, 0, 3), d, width * height)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, x)
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
        out = ctypes.cast(base.ggml_get_data(x), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(out, shape=(width * height, d)).copy()
    finally:
        base.ggml_free(ctx)


def _reference64(table: np.ndarray, width: int, height: int) -> np.ndarray:
    """PyTorch's antialiased bilinear (half-pixel centres, triangle widened by 1/scale when
    shrinking, weights normalised per output) in float64, separably."""
    n = int(round(table.shape[0] ** 0.5))

    def weights(n_out: int) -> np.ndarray:
        scale = n_out / n
        support = max(1.0, 1.0 / scale)
        centre = (np.arange(n_out) + 0.5) / scale
        w = np.maximum(1.0 - np.abs((np.arange(n)[None, :] + 0.5 - centre[:, None]) / support), 0.0)
        return w / w.sum(axis=1, keepdims=True)

    grid = table.astype(np.float64).reshape(n, n, -1)
    return np.einsum("yi,ijd,xj->yxd", weights(height), grid, weights(width)).reshape(width * height, -1)


RESIZES = ((8, 8), (64, 64), (20, 14), (3, 5), (1, 1), (13, 8), (8, 31), (32, 24), (5, 12))


def test_resize_positions_identity_and_shapes() -> None:
    table = np.random.default_rng(0).normal(0, 1, (64, 12)).astype(np.float32)
    assert resize_positions(table, 8, 8) is table
    for w, h in RESIZES:
        out = resize_positions(table, w, h)
        assert out.shape == (w * h, 12) and out.dtype == np.float32 and out.flags.c_contiguous
    constant = np.full((64, 4), 0.3, np.float32)
    assert np.allclose(resize_positions(constant, 20, 14), 0.3, atol=1e-7)
    with pytest.raises(ValueError):
        resize_positions(table[:60], 8, 8)


@pytest.mark.parametrize("n", [8, 16])
def test_resize_positions_matches_ggml_and_float64(n: int) -> None:
    table = np.random.default_rng(n).normal(0, 1, (n * n, 48)).astype(np.float32)
    for w, h in RESIZES:
        ours = resize_positions(table, w, h)
        assert np.allclose(ours, _reference64(table, w, h), rtol=0, atol=2e-6), (n, w, h)
        if (w, h) == (n, n):
            continue
        ggml = _ggml_resize(table, w, h)
        assert np.array_equal(ours, ggml), (n, w, h, np.abs(ours - ggml).max())
        # the unfused accumulation (a build without FMA contraction) is within a few ulp
        assert np.allclose(resize_positions(table, w, h, fused=False), ggml, rtol=0, atol=1e-6)
