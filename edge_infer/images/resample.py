"""libmtmd's image resampler (tools/mtmd/mtmd-image.cpp's resize_pillow: Pillow's separable
bilinear / bicubic (a = -0.5) / Lanczos-3 filters, weights widened when downscaling, fixed-point
weights of 22 fractional bits, a horizontal pass then a vertical one, each rounded to uint8),
in NumPy, so a tile's bytes are libmtmd's for every size (Pillow itself differs from it by one
level on some sizes)."""

from __future__ import annotations

import math

import numpy as np

PRECISION_BITS = 22
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}


def _filter(algo: str, x: float) -> float:
    if algo == "lanczos":
        if -3.0 <= x < 3.0:
            return _sinc(x) * _sinc(x / 3.0)
        return 0.0
    x = abs(x)
    if algo == "bilinear":
        return 1.0 - x if x < 1.0 else 0.0
    a = -0.5
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _sinc(v: float) -> float:
    if v == 0.0:
        return 1.0
    pv = v * math.pi
    return math.sin(pv) / pv


def weights(in_size: int, out_size: int, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """(first input index int64 [out], fixed-point weights int64 [out, ksize]: zero past each
    output's input run) for one dimension."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = _SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    first = np.zeros(out_size, np.int64)
    kk = np.zeros((out_size, ksize), np.int64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = [_filter(algo, (x + xmin - center + 0.5) * ss) for x in range(xmax)]
        total = sum(w)
        for x in range(xmax):
            v = w[x] / total if total != 0.0 else w[x]
            kk[xx, x] = int(v * (1 << PRECISION_BITS) + (-0.5 if v < 0 else 0.5))  # truncation toward zero
        first[xx] = xmin
    return first, kk


def _pass(src: np.ndarray, first: np.ndarray, kk: np.ndarray, in_size: int) -> np.ndarray:
    """Resample axis 1 of uint8 [R, in_size, 3] -> uint8 [R, out, 3]."""
    idx = np.minimum(first[:, None] + np.arange(kk.shape[1]), in_size - 1)  # weights past the run are 0
    out = np.empty((src.shape[0], first.shape[0], src.shape[2]), np.uint8)
    for r0 in range(0, src.shape[0], 64):  # bounded memory: [rows, out, ksize, 3] int64 at a time
        block = src[r0 : r0 + 64][:, idx].astype(np.int64)
        acc = (block * kk[None, :, :, None]).sum(axis=2) + (1 << (PRECISION_BITS - 1))
        out[r0 : r0 + 64] = np.clip(acc >> PRECISION_BITS, 0, 255)
    return out


def resize_u8(pixels: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """uint8 [H, W, 3] -> [height, width, 3] as libmtmd resizes (a copy when the size is equal)."""
    h, w = pixels.shape[:2]
    out = pixels
    if width != w:
        out = _pass(out, *weights(w, width, algo), w)
    if height != h:
        out = _pass(out.transpose(1, 0, 2), *weights(h, height, algo), h).transpose(1, 0, 2)
    return np.ascontiguousarray(out) if out is not pixels else pixels.copy()
