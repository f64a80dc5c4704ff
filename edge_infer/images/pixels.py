"""The pieces every projector's preprocessing shares: what it reads from the projector file
(PixelParams), its result (ImageTiles), libmtmd's resize (with and without PAD_CEIL's padding)
and clip_image_f32's normalisation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edge_infer.errors import InvalidRequest
from edge_infer.images.resample import resize_u8


@dataclass(frozen=True, slots=True)
class PixelParams:
    """What preprocessing reads from the projector's file (clip.vision.*)."""

    projector: str
    image_size: int
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    longest_edge: int = 0  # idefics3's preproc_image_size
    n_merge: int = 1  # lfm2: its sizes are multiples of patch_size * n_merge


@dataclass(frozen=True, slots=True)
class ImageTiles:
    """An image's encoder inputs: tiles float32 [3, H, W] (a grid's, row by row), the grid
    (columns, rows; (0, 0) without one) and the overview (None without one)."""

    tiles: tuple[np.ndarray, ...]
    grid: tuple[int, int] = (0, 0)
    overview: np.ndarray | None = None


def resize(pixels: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """uint8 [H, W, 3] resized to [height, width, 3] with libmtmd's filter (a copy when equal)."""
    if not (0 < width <= 65536 and 0 < height <= 65536):
        raise InvalidRequest(f"image resize target {width}x{height} is out of range (max 65536)")
    return resize_u8(pixels, width, height, algo)


def normalize(pixels: np.ndarray, p: PixelParams) -> np.ndarray:
    """uint8 [H, W, 3] -> float32 [3, H, W]: (x / 255 - mean) / std per channel, in float32."""
    x: np.ndarray = pixels.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(p.image_mean, np.float32)) / np.asarray(p.image_std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def fit_padded(pixels: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """libmtmd's resize with PAD_CEIL: scaled to fit width x height (float32 scale, sides rounded
    up), centred on black."""
    h, w = pixels.shape[:2]
    if h == height and w == width:
        return pixels.copy()
    scale = min(np.float32(width) / np.float32(w), np.float32(height) / np.float32(h))
    nw = min(int(math.ceil(np.float32(w) * scale)), width)
    nh = min(int(math.ceil(np.float32(h) * scale)), height)
    out = np.zeros((height, width, 3), np.uint8)
    ox, oy = (width - nw) // 2, (height - nh) // 2
    out[oy : oy + nh, ox : ox + nw] = resize(pixels, nw, nh, algo)
    return out
