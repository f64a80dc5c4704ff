"""Per-layer RoPE tables as ggml computes them: each rotated pair's angle per position
(inv_freq, float64 [n_rot / 2]) and the factor cos and sin are multiplied by (mscale).

The angle of pair k at position p is p * base^(-2k / n_rot) / ff[k] * s, where ff are the
frequency divisors (Llama 3's rope_freqs, or Phi-3's long / short factors) and s the scaling:
`rope_scale` for linear scaling, and for YaRN a per-pair mix of the scaled and unscaled angle
(pairs below ggml's "low" correction dimension keep the original frequency, those above "high"
take the scaled one, a linear ramp between), with mscale = 1 + 0.1 ln(1 / rope_scale).
Sliding-window layers rotate with their own base (`rope_base_swa`), and with no scaling where
`swa_rope_unscaled` (gemma3, olmo2; gemma4's rotate their own number of dims, without its
full layers' rope_freqs); layers without RoPE (smollm3) get zero angles.
"""

from __future__ import annotations

import math

import numpy as np

from edge_infer.models.config import ModelConfig

YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama.cpp's defaults


def yarn_corr_dims(n_rot: int, orig_ctx: int, base: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair indices where YaRN's ramp starts and ends."""

    def corr_dim(n_rotations: float) -> float:
        return n_rot * math.log(orig_ctx / (n_rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(YARN_BETA_FAST)))
    high = min(n_rot - 1.0, math.ceil(corr_dim(YARN_BETA_SLOW)))
    return low, high


def frequency_divisors(cfg: ModelConfig, n_ctx: int) -> tuple[float, ...]:
    """rope_freqs if the file has them, else Phi-3's long factors when the context (n_ctx tokens)
    exceeds rope_orig_ctx and its short ones otherwise (llama.cpp's get_rope_factors)."""
    if cfg.rope_freqs:
        return cfg.rope_freqs
    if cfg.rope_factors_long:
        return cfg.rope_factors_long if n_ctx > cfg.rope_orig_ctx else cfg.rope_factors_short
    return ()


def layer_rope(cfg: ModelConfig, layer: int, n_ctx: int) -> tuple[np.ndarray, float]:
    """(inv_freq float64 [n_rot / 2], mscale) of one layer for a context of n_ctx tokens."""
    n_rot = cfg.layer_n_rot(layer)
    half = n_rot // 2
    if cfg.nope_layers and cfg.nope_layers[layer]:
        return np.zeros(half, np.float64), 1.0
    base = cfg.layer_rope_base(layer)
    k = np.arange(half, dtype=np.float64)
    inv = base ** (-2.0 * k / n_rot)
    if cfg.swa_layers[layer] and cfg.swa_rope_unscaled:
        return inv, 1.0
    divisors = frequency_divisors(cfg, n_ctx)
    if divisors:
        inv = inv / np.asarray(divisors, np.float64)
    mscale = cfg.rope_attn_factor
    if cfg.rope_scaling == "yarn":
        low, high = yarn_corr_dims(n_rot, cfg.rope_orig_ctx, base)
        ramp = 1.0 - np.clip((k - low) / max(0.001, high - low), 0.0, 1.0)  # 1: keep the original angle
        inv = inv * (cfg.rope_scale * (1.0 - ramp) + ramp)
        mscale *= 1.0 + 0.1 * math.log(1.0 / cfg.rope_scale)
    else:
        inv = inv * cfg.rope_scale
    return inv, mscale


def mrope_components(sections: tuple[int, ...], n_pairs: int) -> np.ndarray:
    """int64 [n_pairs]: the position component each rotated pair takes in ggml's M-RoPE, its
    sections contiguous and repeating every sum(sections) pairs: 0 t, 1 h (an image token's
    row), 2 w (its column), 3 e (always position 0: llama.cpp gives text and image tokens 0)."""
    sector = np.arange(n_pairs) % max(1, sum(sections))
    return np.searchsorted(np.cumsum(sections[:3]), sector, side="right").astype(np.int64)


class MRope:
    """M-RoPE's rotation of Q and K on the host, as the qkv_finish kernel rotates (float64
    angles, float32 products). A step's cos / sin tables are made once per distinct rope and
    shared by the layers that have it (qwen2vl's all do), not remade per layer."""

    def __init__(self, sections: tuple[int, ...]) -> None:
        self.sections = sections
        self._pos: np.ndarray | None = None  # the step whose tables are kept (held: its identity stays its own)
        self._tables: dict[tuple[bytes, float], tuple[np.ndarray, np.ndarray]] = {}

    def rotate(self, xs: tuple[np.ndarray, ...], head_dim: int, n_rot: int, inv_freq: np.ndarray, mscale: float,
               pos3: np.ndarray) -> None:
        """Each x float32 [N, heads * head_dim] (C-contiguous: Q, K) rotated in place in NEOX
        pairs (i, i + n_rot / 2): pair i by the angle pos3[:, c] * inv_freq[i], c its section's
        component (mrope_components; pos3 int [N, 3]: t, h, w), cos and sin times mscale."""
        if pos3 is not self._pos:
            self._pos, self._tables = pos3, {}
        key = (inv_freq.tobytes(), mscale)
        if key not in self._tables:
            pos = np.zeros((pos3.shape[0], 4), np.float64)
            pos[:, :3] = pos3
            ang = pos[:, mrope_components(self.sections, n_rot // 2)] * inv_freq
            self._tables[key] = ((np.cos(ang) * mscale).astype(np.float32)[:, None, :],
                                 (np.sin(ang) * mscale).astype(np.float32)[:, None, :])
        c, s = self._tables[key]
        half = n_rot // 2
        for x in xs:
            if not x.flags.c_contiguous:
                raise ValueError("MRope.rotate rotates C-contiguous arrays in place")
            v = x.reshape(pos3.shape[0], -1, head_dim)
            x0, x1 = v[..., :half].copy(), v[..., half:n_rot].copy()
            v[..., :half] = x0 * c - x1 * s
            v[..., half:n_rot] = x0 * s + x1 * c
