"""A mixture-of-experts FFN's weights (weights.py loads a layer; this names and checks what the
router and the expert stacks take from the file, in llama.cpp's tensor names and shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights_recurrent import TensorSource

EXPERT_FIELDS = ("router", "gate", "up", "down")


@dataclass(slots=True)
class ExpertWeights:
    """A mixture-of-experts FFN: the router [E, D] (ffn_gate_inp) and the experts' gate, up
    [E, Fe, D] and down [E, D, Fe] stacks (QMatrix with 3-D data); n_used experts per token.
    shared_gate f32 [D]: qwen2moe's gate of the shared expert (the layer's dense FFN); None for
    an ungated one (granitehybrid) or none; select_bias (lfm2moe's exp_probs_b) ranks the
    experts, not weighting them."""

    router: QMatrix
    gate: QMatrix
    up: QMatrix
    down: QMatrix
    n_used: int
    shared_gate: np.ndarray | None = None
    select_bias: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # f32 [E], or [0]: none
    router_bias: np.ndarray | None = None  # gpt-oss: f32 [E] added to the router's logits
    gate_bias: np.ndarray | None = None  # gpt-oss: f32 [E, Fe] per expert (up_bias too)
    up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None  # f32 [E, D]
    # gemma4: the router's input scale f32 [D] (ffn_gate_inp.scale / sqrt(D)), each expert's
    # output scale [E] (ffn_down_exps.scale, ones when absent), the experts' input norm
    # (pre_ffw_norm_2), the dense MLP's and the experts' output norms (post_ffw_norm_1, _2)
    router_scale: np.ndarray | None = None
    down_scale: np.ndarray | None = None
    input_norm: np.ndarray | None = None
    dense_norm: np.ndarray | None = None
    post_norm: np.ndarray | None = None


def _gate_up(t: TensorSource, p: str, e: int, fe: int, d: int) -> tuple[QMatrix, QMatrix]:
    """The experts' gate and up stacks: ffn_gate_exps and ffn_up_exps, or one ffn_gate_up_exps
    [E, 2 Fe, D] (gemma4: gate rows first) split into two (copies: each expert contiguous)."""
    if not t.has(p + "ffn_gate_up_exps.weight"):
        return t.stack(p + "ffn_gate_exps.weight", e, fe, d), t.stack(p + "ffn_up_exps.weight", e, fe, d)
    both = t.stack(p + "ffn_gate_up_exps.weight", e, 2 * fe, d)
    return tuple(QMatrix(both.name, np.ascontiguousarray(both.data[:, rows]), both.qtype, fe, d)  # type: ignore[return-value]
                 for rows in (slice(0, fe), slice(fe, 2 * fe)))


def load_experts(t: TensorSource, cfg: ModelConfig, p: str) -> ExpertWeights:
    """Layer p's mixture-of-experts FFN (lfm2moe: with the selection bias exp_probs_b)."""
    d, e, fe = cfg.d_model, cfg.n_experts, cfg.expert_ffn_dim
    gate, up = _gate_up(t, p, e, fe, d)
    ew = ExpertWeights(
        router=t.mat(p + "ffn_gate_inp.weight", e, d),
        gate=gate,
        up=up,
        down=t.stack(p + "ffn_down_exps.weight", e, d, fe),
        n_used=cfg.n_experts_used,
        shared_gate=t.vec(p + "ffn_gate_inp_shexp.weight", d) if cfg.shared_ffn_dim and cfg.shared_expert_gated else None,
        select_bias=t.vec(p + "exp_probs_b.bias", e) if cfg.expert_select_bias else np.zeros(0, np.float32),
    )
    if cfg.expert_biases:  # gpt-oss
        ew.router_bias = t.vec(p + "ffn_gate_inp.bias", e)
        ew.gate_bias = t.vec(p + "ffn_gate_exps.bias", e * fe).reshape(e, fe)
        ew.up_bias = t.vec(p + "ffn_up_exps.bias", e * fe).reshape(e, fe)
        ew.down_bias = t.vec(p + "ffn_down_exps.bias", e * d).reshape(e, d)
    if cfg.moe_beside_dense:  # gemma4
        ew.router_scale = t.vec(p + "ffn_gate_inp.scale", d) / np.float32(np.sqrt(d))
        scale = p + "ffn_down_exps.scale"
        ew.down_scale = t.vec(scale, e) if t.has(scale) else None
        ew.input_norm, ew.dense_norm, ew.post_norm = (t.vec(p + name, d) for name in (
            "pre_ffw_norm_2.weight", "post_ffw_norm_1.weight", "post_ffw_norm_2.weight"))
    return ew
