"""The recurrent blocks' weights (weights.py loads a layer; this names and checks what a
short convolution, a Mamba2 block and a Gated DeltaNet block take from the file, in llama.cpp's
tensor names and shapes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.config import ModelConfig


class TensorSource(Protocol):
    """What the loaders read through (weights.Tensors): a checked matrix or float32 vector by
    name, remembering it was used; `has(name)` for optional tensors."""

    def mat(self, name: str, rows: int, cols: int) -> QMatrix: ...

    def vec(self, name: str, n: int) -> np.ndarray: ...

    def stack(self, name: str, n_experts: int, rows: int, cols: int) -> QMatrix: ...

    def shape(self, name: str) -> tuple[int, ...] | None: ...

    def has(self, name: str) -> bool: ...


@dataclass(slots=True)
class SsmWeights:
    """A Mamba2 block's vectors (its in_proj and out_proj are the layer's): conv f32 [C, L] the
    convolution's taps over x, B, C (C = ssm_conv_dim) and conv_bias [C] (zeros when the file
    has none); per head dt_bias, a (-exp(A_log), as the converter stores it) and d; norm
    [ssm_inner] the grouped RMSNorm's weight ([0]: falcon-h1 without ssm_norm, no norm)."""

    conv: np.ndarray
    conv_bias: np.ndarray
    dt_bias: np.ndarray
    a: np.ndarray
    d: np.ndarray
    norm: np.ndarray


@dataclass(slots=True)
class DeltaWeights:
    """A Gated DeltaNet block's own weights (its qkv projection and ssm_out are the layer's
    in_proj and out_proj): z [V, D] the output gate's projection (attn_gate), beta and alpha
    [H, D]; conv f32 [C, L] the convolution's taps over q, k, v (conv_bias: zeros, it has none);
    per head dt_bias and a (-exp(A_log)); norm [S] the per-head RMSNorm's weight."""

    z: QMatrix
    beta: QMatrix
    alpha: QMatrix
    conv: np.ndarray
    conv_bias: np.ndarray
    dt_bias: np.ndarray
    a: np.ndarray
    norm: np.ndarray


DELTA_FIELDS = ("z", "beta", "alpha")


def load_recurrent(t: TensorSource, cfg: ModelConfig, i: int, lw: Any) -> None:
    """Layer i's recurrent block into lw (a LayerWeights): in_proj, out_proj and its own parts."""
    p = f"blk.{i}."
    if cfg.is_conv(i):
        d = cfg.d_model
        lw.in_proj = t.mat(p + "shortconv.in_proj.weight", 3 * d, d)
        lw.conv = t.vec(p + "shortconv.conv.weight", d * cfg.conv_kernel).reshape(d, cfg.conv_kernel)
        lw.out_proj = t.mat(p + "shortconv.out_proj.weight", d, d)
    elif cfg.is_ssm(i):
        _mamba2(t, cfg, p, lw)
    elif cfg.is_delta(i):
        _gated_delta(t, cfg, p, lw)


def _mamba2(t: TensorSource, cfg: ModelConfig, p: str, lw: Any) -> None:
    """Layer p's Mamba2 block (llama.cpp's tensor names and shapes; the conv bias and, for
    falcon-h1, the norm optional as llama.cpp loads them)."""
    d, e, c, h, k = cfg.d_model, cfg.ssm_inner, cfg.ssm_conv_dim, cfg.ssm_heads, cfg.ssm_conv_kernel
    lw.in_proj = t.mat(p + "ssm_in.weight", 2 * e + 2 * cfg.ssm_groups * cfg.ssm_state + h, d)
    lw.out_proj = t.mat(p + "ssm_out.weight", d, e)
    bias, norm = p + "ssm_conv1d.bias", p + "ssm_norm.weight"
    lw.ssm = SsmWeights(
        conv=t.vec(p + "ssm_conv1d.weight", c * k).reshape(c, k),
        conv_bias=t.vec(bias, c) if t.has(bias) else np.zeros(c, np.float32),
        dt_bias=t.vec(p + "ssm_dt.bias", h), a=t.vec(p + "ssm_a", h), d=t.vec(p + "ssm_d", h),
        norm=t.vec(norm, e) if t.has(norm) or not cfg.parallel_ssm else np.zeros(0, np.float32),
    )


def _gated_delta(t: TensorSource, cfg: ModelConfig, p: str, lw: Any) -> None:
    """Layer p's Gated DeltaNet block (llama.cpp's qwen35 / qwen3next tensor names and shapes)."""
    d, v, c, h, k = cfg.d_model, cfg.ssm_inner, cfg.ssm_conv_dim, cfg.ssm_heads, cfg.ssm_conv_kernel
    if t.has(p + "ssm_in.weight"):
        raise UnsupportedModelError(f"tensor {p}ssm_in.weight: the early Qwen3-Next layout (q, k, v, z fused per key "
                                    "head) is not supported; convert the model again with a current llama.cpp")
    lw.in_proj = t.mat(p + "attn_qkv.weight", c, d)
    lw.out_proj = t.mat(p + "ssm_out.weight", d, v)
    if t.has(p + "ssm_ba.weight"):  # qwen3next
        beta, alpha = _split_ba(t.mat(p + "ssm_ba.weight", 2 * h, d), cfg.ssm_groups)
    else:
        beta, alpha = t.mat(p + "ssm_beta.weight", h, d), t.mat(p + "ssm_alpha.weight", h, d)
    lw.delta = DeltaWeights(
        z=t.mat(p + "attn_gate.weight", v, d), beta=beta,
        alpha=alpha, conv=t.vec(p + "ssm_conv1d.weight", c * k).reshape(c, k),
        conv_bias=np.zeros(c, np.float32),
        dt_bias=t.vec(p + "ssm_dt.bias", h), a=t.vec(p + "ssm_a", h), norm=t.vec(p + "ssm_norm.weight", cfg.ssm_state),
    )


def _split_ba(ba: QMatrix, k_heads: int) -> tuple[QMatrix, QMatrix]:
    """Qwen3-Next's ssm_ba [2H, D], rows per key head g [b of its H/Hk value heads | their a], as
    beta and alpha [H, D] (row copies: quantization is per row)."""
    r = ba.rows // (2 * k_heads)
    rows = np.arange(ba.rows).reshape(k_heads, 2, r)
    return tuple(QMatrix(ba.name, np.ascontiguousarray(ba.data[rows[:, j].reshape(-1)]), ba.qtype, k_heads * r, ba.cols)
                 for j in (0, 1))  # type: ignore[return-value]
