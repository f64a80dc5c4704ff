"""The vision towers' 2-D RoPE on Q and K, in NumPy on the host rows: Qwen2.5-VL's
(rope_2d_halves) and Pixtral's (clip_graph::build_rope_2d with interleaved
frequencies), in NumPy on the host rows: in every head, the first half of the dimensions is
rotated by the patch's row and the second half by its column, each half in adjacent pairs
(ggml's normal RoPE mode) with the even (rows) and odd (columns) frequencies of the whole head:
    pair i of the first half:  angle = row * theta^(-4i / hd)
    pair i of the second half: angle = col * theta^(-(4i + 2) / hd)
The angles are built as ggml builds them (float32, theta_scale multiplied in per pair)."""

from __future__ import annotations

import numpy as np


def _angles(pos: np.ndarray, n_pairs: int, theta_scale: np.float32, freq_scale: np.float32) -> np.ndarray:
    """float32 [N, n_pairs]: pos * freq_scale * theta_scale^i, the product accumulated in float32."""
    out = np.empty((pos.shape[0], n_pairs), np.float32)
    t = pos.astype(np.float32) * freq_scale
    for i in range(n_pairs):
        out[:, i] = t
        t = (t * theta_scale).astype(np.float32)
    return out


def _rotate(x: np.ndarray, ang: np.ndarray) -> None:
    """x float32 [N, H, 2P] (a view) rotated in place by ang [N, P] in adjacent pairs."""
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2].copy(), x[..., 1::2].copy()
    x[..., 0::2] = x0 * c - x1 * s
    x[..., 1::2] = x0 * s + x1 * c


def rope_2d(x: np.ndarray, head_dim: int, rows: np.ndarray, cols: np.ndarray, theta: float) -> None:
    """x float32 [N, n_heads * head_dim] rotated in place; rows, cols int [N] the patches' grid
    coordinates."""
    n = x.shape[0]
    v = x.reshape(n, -1, head_dim)
    half = head_dim // 2
    scale = np.float32(np.float32(theta) ** np.float32(-2.0 / half))
    odd = np.float32(np.float32(theta) ** np.float32(-2.0 / head_dim))
    _rotate(v[..., :half], _angles(rows, half // 2, scale, np.float32(1.0)))
    _rotate(v[..., half:], _angles(cols, half // 2, scale, odd))


def rope_2d_halves(x: np.ndarray, head_dim: int, rows: np.ndarray, cols: np.ndarray, theta: float) -> None:
    """Qwen2.5-VL's 2-D RoPE (ggml_rope_multi in VISION mode, four sections of head_dim / 4
    pairs, each restarting its angle): x float32 [N, n_heads * head_dim] rotated in place in
    NEOX pairs (i, i + head_dim / 2), pair i < head_dim / 4 by the patch's row,
        angle = row * theta^(-4i / hd),
    and pair head_dim / 4 + i by its column, angle = col * theta^(-4i / hd)."""
    n = x.shape[0]
    v = x.reshape(n, -1, head_dim)
    half, quarter = head_dim // 2, head_dim // 4
    scale = np.float32(np.float32(theta) ** np.float32(-2.0 / half))  # ggml's theta_scale with n_dims = hd / 2
    one = np.float32(1.0)
    ang = np.concatenate([_angles(rows, quarter, scale, one), _angles(cols, quarter, scale, one)], axis=1)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = v[..., :half].copy(), v[..., half:].copy()
    v[..., :half] = x0 * c - x1 * s
    v[..., half:] = x0 * s + x1 * c
