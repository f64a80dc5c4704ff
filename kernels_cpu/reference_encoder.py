"""Slow NumPy twins (float64 math) of the encoder kernels in encoder.py, for the tests: same
arguments, the result returned instead of written into a preallocated output."""

from __future__ import annotations

import numpy as np


def layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm of each row of x [T, D] with weight and bias [D]."""
    x64 = x.astype(np.float64)
    c = x64 - x64.mean(-1, keepdims=True)
    return (c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + b).astype(np.float32)


def add_layernorm(x: np.ndarray, bias: np.ndarray, res: np.ndarray, w: np.ndarray, b: np.ndarray,
                  eps: float) -> np.ndarray:
    s = x.astype(np.float64) + (bias if bias.size else 0.0) + res
    return layernorm(s, w, b, eps)


def input_layernorm(x: np.ndarray, type_row: np.ndarray, pos_table: np.ndarray, positions: np.ndarray,
                    w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    s = x.astype(np.float64) + type_row + (pos_table[positions] if pos_table.shape[0] else 0.0)
    return layernorm(s, w, b, eps)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return 0.5 * x64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)))


def bias_gelu(x: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return gelu_tanh(x.astype(np.float64) + (bias if bias.size else 0.0)).astype(np.float32)


def softmax_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """softmax_rows_kernel's twin in float64: (exp(x - each row's max), 1 / each row's sum)."""
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e, 1.0 / e.sum(axis=1)


def encoder_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, seq_start: np.ndarray, seq_end: np.ndarray,
                      head_dim: int, scale: float, slopes: np.ndarray, window: int = 0) -> np.ndarray:
    """Each query over its own input's rows (within window // 2 of it when window > 0), every
    head, in float64."""
    n_tok, n_heads = q.shape[0], q.shape[1] // head_dim
    rep = n_heads // (k.shape[1] // head_dim)
    out = np.zeros(q.shape, np.float64)
    for t in range(n_tok):
        rows = np.arange(seq_start[t], seq_end[t])
        if window > 0:
            rows = rows[np.abs(rows - t) <= window // 2]
        for h in range(n_heads):
            g = h // rep
            qh = q[t, h * head_dim:(h + 1) * head_dim].astype(np.float64)
            kh = k[rows, g * head_dim:(g + 1) * head_dim].astype(np.float64)
            s = kh @ qh * scale
            if slopes.size:
                s = s - slopes[h] * np.abs(t - rows)
            p = np.exp(s - s.max())
            out[t, h * head_dim:(h + 1) * head_dim] = (p / p.sum()) @ v[rows, g * head_dim:(g + 1) * head_dim]
    return out.astype(np.float32)
