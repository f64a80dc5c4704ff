"""Slow NumPy twins of kernels_cpu/altup.py, in float64: they return their outputs."""

from __future__ import annotations

import numpy as np


def altup_predict(streams: np.ndarray, r: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """pred [A, T, D] (its [0] is the active stream); arguments as altup_predict_kernel's."""
    s = streams.astype(np.float64)
    a = s.shape[0]
    c = np.tanh(r.astype(np.float64)) @ coef.astype(np.float64).T  # [T, A*A]
    mix = np.einsum("tjk,ktd->jtd", c.reshape(-1, a, a), s)
    return (mix + s).astype(np.float32)


def altup_correct(pred: np.ndarray, y: np.ndarray, r: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """streams [A, T, D]; arguments as altup_correct_kernel's."""
    p = pred.astype(np.float64)
    c = np.tanh(r.astype(np.float64)) @ coef.astype(np.float64).T + 1.0  # [T, A]
    return ((y.astype(np.float64) - p[0])[None] * c.T[:, :, None] + p).astype(np.float32)


def match_norm(ref: np.ndarray, x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    ratio = np.linalg.norm(ref.astype(np.float64), axis=1) / np.linalg.norm(x64, axis=1)
    return (x64 * ratio[:, None]).astype(np.float32)


def unembed_mean(active: np.ndarray, unembedded: np.ndarray) -> np.ndarray:
    u = unembedded.astype(np.float64)
    return ((active.astype(np.float64) + u[1:].sum(axis=0)) / u.shape[0]).astype(np.float32)


def gaussian_topk(x: np.ndarray, std_mul: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    cutoff = x64.mean(axis=1) + x64.std(axis=1, ddof=1) * std_mul
    return np.maximum(x64 - cutoff[:, None], 0.0).astype(np.float32)


def mul_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) * w.astype(np.float64)).astype(np.float32)
