"""A learned square position-embedding table resized to a patch grid as llama.cpp's libmtmd does
for LFM2 (tools/mtmd/clip.cpp, clip_graph::resize_position_embeddings): ggml_interpolate with
DEFAULT_INTERPOLATION_MODE = GGML_SCALE_MODE_BILINEAR | GGML_SCALE_FLAG_ANTIALIAS (clip-graph.h),
i.e. PyTorch's bilinear with antialias=True and half-pixel centres, in ggml's CPU kernel
(ggml-cpu/ops.cpp, ggml_compute_forward_upscale_f32) reproduced bit for bit:

- per output pixel, source rows (outer) and columns (inner) within the filter support, each with
  weight tri(dy) * tri(dx) in float32 (the triangle widened by the scale when downsizing);
- val += pixel * weight accumulated in float32 in that order, fused (one rounding per step: the
  llama.cpp CPU build contracts it to an FMA; fused=False rounds the product too), then divided
  by the summed weights."""

from __future__ import annotations

import numpy as np

f32, f64 = np.float32, np.float64


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once. a * b is exact in float64; the sum is rounded to odd
    (TwoSum's error moves an inexact even result one ulp towards the exact value), so the
    second rounding, to float32, is the correctly rounded result."""
    p = a.astype(f64) * b.astype(f64)
    c64 = c.astype(f64)
    s = p + c64
    bv = s - p
    err = (p - (s - bv)) + (c64 - bv)
    even = (s.view(np.int64) & 1) == 0
    s = np.where((err != 0) & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(f32)


def _axis(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices and triangle weights [n_out, k] along one axis (unused slots: weight 0),
    with the kernel's float32 expressions in its order of evaluation."""
    half, one = f32(0.5), f32(1.0)
    sf = f32(n_out) / f32(n_in)
    support = max(one, one / sf)  # at least one source pixel each side
    invscale = one / support
    centre = (np.arange(n_out, dtype=f32) + half) / sf
    # (int64_t) of a float truncates towards zero, then clamped to the source
    lo = np.maximum(np.trunc(centre - support + half), 0).astype(np.int64)
    hi = np.minimum(np.trunc(centre + support + half), n_in).astype(np.int64)
    idx = lo[:, None] + np.arange(int((hi - lo).max()))[None, :]
    dist = (idx.astype(f32) - centre[:, None] + half) * invscale
    w = np.maximum(one - np.abs(dist), f32(0)).astype(f32)
    return np.minimum(idx, n_in - 1), np.where(idx < hi[:, None], w, f32(0)).astype(f32)


def resize_positions(table: np.ndarray, width: int, height: int, *, fused: bool = True) -> np.ndarray:
    """float32 [n * n, D] (patches in raster order) -> float32 [height * width, D] (raster
    order, width columns); the table itself when width == height == n."""
    nn, d = table.shape
    n = int(round(nn**0.5))
    if n * n != nn:
        raise ValueError(f"position table of {nn} rows is not square")
    if width == n and height == n:
        return table
    grid = np.asarray(table, f32).reshape(n, n, d)  # [y, x, D]
    xi, xw = _axis(width, n)
    yi, yw = _axis(height, n)
    val = np.zeros((height, width, d), f32)
    total = np.zeros((height, width, 1), f32)
    # Zero-weight terms (skipped by the kernel) add +-0, which leaves the sums unchanged.
    for ky in range(yi.shape[1]):
        for kx in range(xi.shape[1]):
            w = (yw[:, ky, None] * xw[None, :, kx])[:, :, None]  # float32 product, as wx * wy
            pix = grid[yi[:, ky][:, None], xi[:, kx][None, :]]
            val = _fma32(pix, w, val) if fused else val + pix * w
            total = total + w
    out = np.where(total > 0, val / np.where(total > 0, total, f32(1)), val)
    return np.ascontiguousarray(out.reshape(height * width, d), dtype=f32)
