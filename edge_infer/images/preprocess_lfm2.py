"""LFM2-VL's image preprocessing as llama.cpp's libmtmd does it (tools/mtmd/mtmd-image.cpp,
mtmd_image_preprocessor_lfm2 on top of the llava-uhd slicer; limits from clip.cpp).

- The "smart resize" size: each side rounded to a multiple of patch_size * n_merge, then scaled
  (aspect kept) into [min_tokens, max_tokens] merged tokens (64 and 256 unless overridden).
- An image whose side-rounded area exceeds twice the max pixels is tiled: a grid of 2..10
  512x512 tiles whose aspect ratio is closest to the image's; the image is fitted into the grid
  (aspect kept, sides rounded up, centred on black) and cut row by row; the smart-resized image
  is the thumbnail (the overview), encoded after the tiles. Otherwise the smart-resized image is
  the only tile.

Every resize is bilinear (libmtmd's Pillow-style resampler, images/resample.py). Arithmetic
follows the C++ types: float32 where it uses float, float64 where it uses double."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edge_infer.errors import InvalidRequest
from edge_infer.images.pixels import ImageTiles, PixelParams, normalize, resize

TILE = 512  # mtmd_image_preprocessor_lfm2::tile_size (not the encoder's image_size)
MIN_TILES, MAX_TILES = 2, 10
MAX_PIXELS_TOLERANCE = 2.0
DEFAULT_TOKENS = (64, 256)  # clip.cpp: hparams.set_limit_image_tokens(64, 256) for LFM2
ALGO = "bilinear"  # LFM2's image_resize_algo, _rf and _ov

f32 = np.float32


def _c_round(x: np.float32) -> int:
    """std::round of a non-negative float: halves up (Python's round() takes them to even);
    the + 0.5 in float64, exact, where float32 could round 0.49999997 + 0.5 up to 1."""
    return math.floor(float(x) + 0.5)


def smart_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """img_tool::calc_size_preserved_ratio (no longest edge): (width, height), float32 math."""
    fa = f32(align)
    w_bar = max(align, _c_round(f32(width) / fa) * align)
    h_bar = max(align, _c_round(f32(height) / fa) * align)
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels), dtype=f32)
        h_bar = max(align, math.floor(f32(height) / beta / fa) * align)
        w_bar = max(align, math.floor(f32(width) / beta / fa) * align)
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)), dtype=f32)
        h_bar = math.ceil(f32(height) * beta / fa) * align
        w_bar = math.ceil(f32(width) * beta / fa) * align
    return w_bar, h_bar


def should_tile(width: int, height: int, patch_size: int, align: int, max_pixels: int) -> bool:
    """mtmd_image_preprocessor_lfm2::should_tile: here the rounding is std::nearbyint of a
    double (ties to even, which Python's round() does), floored at patch_size (not align)."""
    h_bar = max(patch_size, round(float(f32(height)) / align) * align)
    w_bar = max(patch_size, round(float(f32(width)) / align) * align)
    return float(h_bar) * float(w_bar) > float(max_pixels) * MAX_PIXELS_TOLERANCE


def target_ratios() -> list[tuple[int, int]]:
    """Grids (cols, rows) of MIN_TILES..MAX_TILES tiles, by tile count. mtmd's std::sort is not
    stable, but only equal-area pairs (w, h) / (h, w) could swap and those never tie for the
    best aspect (the square grid between them is always closer), so a stable sort is enough."""
    ratios: list[tuple[int, int]] = []
    for n in range(MIN_TILES, MAX_TILES + 1):
        for w in range(1, n + 1):
            for h in range(1, n + 1):
                if MIN_TILES <= w * h <= MAX_TILES and (w, h) not in ratios:
                    ratios.append((w, h))
    return sorted(ratios, key=lambda r: r[0] * r[1])


def grid_layout(width: int, height: int) -> tuple[int, int]:
    """find_closest_aspect_ratio: (cols, rows); on equal distance the later (larger) grid wins
    when the image covers more than half its area."""
    aspect = f32(width) / f32(height)
    area = f32(width * height)
    best, best_diff = (1, 1), f32(np.finfo(np.float32).max)
    for cols, rows in target_ratios():
        diff = abs(aspect - f32(cols) / f32(rows))
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > f32(0.5) * f32(TILE * TILE * cols * rows):
            best = (cols, rows)
    return best


def fit_ceil(pixels: np.ndarray, width: int, height: int) -> np.ndarray:
    """img_tool::resize with PAD_CEIL (the refined image's default padding): scaled to fit
    width x height keeping its aspect (float32 scale, sides rounded up), centred on black."""
    h, w = pixels.shape[:2]
    if (w, h) == (width, height):
        return pixels.copy()
    scale = min(f32(width) / f32(w), f32(height) / f32(h))
    nw = min(math.ceil(f32(w) * scale), width)
    nh = min(math.ceil(f32(h) * scale), height)
    out = np.zeros((height, width, 3), np.uint8)
    ox, oy = (width - nw) // 2, (height - nh) // 2
    out[oy : oy + nh, ox : ox + nw] = resize(pixels, nw, nh, ALGO)
    return out


def lfm2_tiles(pixels: np.ndarray, image_size: int, patch_size: int, n_merge: int,
               mean: Sequence[float], std: Sequence[float], min_tokens: int = 64,
               max_tokens: int = 256) -> ImageTiles:
    """The LFM2 encoder inputs of one RGB image uint8 [H, W, 3]: one smart-resized tile (grid
    (0, 0), no overview), or 512x512 tiles row by row, grid (cols, rows) and the thumbnail as
    overview. Token limits <= 0 mean LFM2's defaults (as mtmd's -1)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise InvalidRequest("an image must be uint8 [height, width, 3]")
    height, width = pixels.shape[:2]
    if width <= 0 or height <= 0:
        raise InvalidRequest("an image must have at least one pixel")
    align = patch_size * n_merge
    patch_area = align * align
    min_pixels = (min_tokens if min_tokens > 0 else DEFAULT_TOKENS[0]) * patch_area
    max_pixels = (max_tokens if max_tokens > 0 else DEFAULT_TOKENS[1]) * patch_area
    p = PixelParams("lfm2", image_size, patch_size,
                    (float(mean[0]), float(mean[1]), float(mean[2])),
                    (float(std[0]), float(std[1]), float(std[2])))

    ow, oh = smart_size(width, height, align, min_pixels, max_pixels)
    overview = normalize(resize(pixels, ow, oh, ALGO), p)  # PAD_NONE: a plain resize
    if not should_tile(width, height, patch_size, align, max_pixels):
        return ImageTiles((overview,))

    cols, rows = grid_layout(width, height)
    refined = fit_ceil(pixels, cols * TILE, rows * TILE)
    tiles = tuple(normalize(refined[r * TILE : (r + 1) * TILE, c * TILE : (c + 1) * TILE], p)
                  for r in range(rows) for c in range(cols))
    return ImageTiles(tiles, (cols, rows), overview)
