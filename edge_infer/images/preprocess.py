"""Pixels -> the float32 tiles a vision encoder takes, as llama.cpp's libmtmd prepares them
(tools/mtmd/mtmd-image.cpp) per projector:

- gemma3 (fixed size): the image fitted into image_size x image_size keeping its aspect ratio
  (the scaled sides rounded up), centred on black, bilinear;
- pixtral, qwen2.5vl: each side a multiple of patch_size * n_merge, scaled (aspect kept) to
  8 .. 1024 tokens (qwen2.5vl: 8 .. 4096), bicubic;
- idefics3 (SmolVLM): resized so its longer side is the preprocessor's longest edge (the other
  side made even), then both sides up to multiples of image_size, cut into image_size tiles,
  plus the whole image at image_size (the overview), Lanczos.

- lfm2: preprocess_lfm2.py.
libmtmd's resampler (Pillow's filters, fixed-point weights and two passes) is images/resample.py;
each tile is normalised as clip_image_f32 (pixels.py): x / 255, then (x - mean) / std, in
float32, and kept planar: float32 [3, H, W]."""

from __future__ import annotations

import numpy as np

from edge_infer.errors import InvalidRequest
from edge_infer.images.pixels import ImageTiles, PixelParams, fit_padded, normalize, resize
from edge_infer.images.preprocess_lfm2 import lfm2_tiles, smart_size

# libmtmd's dyn_size projectors: (fewest, most) tokens an image becomes (clip.cpp's set_limit_image_tokens)
DYN_SIZE_TOKENS = {"pixtral": (8, 1024), "qwen2.5vl_merger": (8, 4096)}

__all__ = ["ImageTiles", "PixelParams", "fit_padded", "normalize", "preprocess", "resize"]


def idefics3_sizes(w: int, h: int, longest: int, tile: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((width, height) after the longest-edge resize, (grid columns, rows))."""
    aspect = w / h
    if w >= h:
        rw, rh = longest, int(longest / aspect)
        rh += rh % 2
    else:
        rw, rh = int(longest * aspect), longest
        rw += rw % 2
    return (rw, rh), ((rw + tile - 1) // tile, (rh + tile - 1) // tile)


def preprocess(pixels: np.ndarray, p: PixelParams) -> ImageTiles:
    """The encoder inputs of one RGB image uint8 [H, W, 3] for projector p.projector."""
    if p.projector == "gemma3":
        return ImageTiles((normalize(fit_padded(pixels, p.image_size, p.image_size, "bilinear"), p),))
    if p.projector == "idefics3":
        tile = p.image_size
        (rw, rh), (gx, gy) = idefics3_sizes(pixels.shape[1], pixels.shape[0], p.longest_edge, tile)
        refined = resize(resize(pixels, rw, rh, "lanczos"), gx * tile, gy * tile, "lanczos")
        overview = normalize(resize(refined, tile, tile, "lanczos"), p)
        tiles = tuple(normalize(refined[y * tile : (y + 1) * tile, x * tile : (x + 1) * tile], p)
                      for y in range(gy) for x in range(gx))
        return ImageTiles(tiles, (gx, gy), overview)
    if p.projector in DYN_SIZE_TOKENS:  # dyn_size: aligned, a token range, aspect kept, bicubic
        align, (lo, hi) = p.patch_size * p.n_merge, DYN_SIZE_TOKENS[p.projector]
        w, h = smart_size(pixels.shape[1], pixels.shape[0], align, lo * align * align, hi * align * align)
        return ImageTiles((normalize(fit_padded(pixels, w, h, "bicubic"), p),))
    if p.projector == "lfm2":
        return lfm2_tiles(pixels, p.image_size, p.patch_size, p.n_merge, p.image_mean, p.image_std)
    raise InvalidRequest(f"images for projector {p.projector!r} are not supported")
