"""The architecture cases of tests/models/test_architectures.py (each dense and mixture-of-experts
architecture with the metadata that makes its features bite), shared with the CUDA backend's
simulator test of the same architectures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from arch_models import write_arch_model

HALF_ROT = 8  # n_rot / 2 for the F32 models (head_dim 16)


def _factors(lo: float, hi: float, n: int = HALF_ROT) -> np.ndarray:
    return np.geomspace(lo, hi, n)


# name: (arch, metadata, rope-factor tensors, {feature: the config change that switches it off})
CASES: dict[str, tuple[str, dict[str, object], dict[str, np.ndarray], dict[str, dict[str, Any]]]] = {
    "llama": ("llama", {}, {}, {}),
    "llama3-rope": ("llama", {}, {"rope_freqs.weight": _factors(1.0, 8.0)}, {"rope_freqs": {"rope_freqs": (), "ignored_tensors": ("rope_freqs.weight",)}}),
    "qwen2-yarn": ("qwen2", {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
                            "qwen2.rope.scaling.original_context_length": 32}, {},
                   {"yarn": {"rope_scaling": "linear"}}),
    "qwen3": ("qwen3", {}, {}, {}),
    "phi3-long": ("phi3", {"phi3.rope.scaling.original_context_length": 32, "phi3.rope.scaling.attn_factor": 1.2},
                  {"rope_factors_long.weight": _factors(1.0, 6.0), "rope_factors_short.weight": _factors(1.0, 1.5)},
                  {"long factors": {"rope_factors_long": tuple(_factors(1.0, 1.5))},
                   "attn_factor": {"rope_attn_factor": 1.0}}),
    "phi3-short": ("phi3", {"phi3.rope.scaling.original_context_length": 4096},
                   {"rope_factors_long.weight": _factors(1.0, 1.5), "rope_factors_short.weight": _factors(1.0, 6.0)},
                   {"short factors": {"rope_factors_short": tuple(_factors(1.0, 1.5))}}),
    "gemma2": ("gemma2", {"gemma2.attention.sliding_window": 8, "gemma2.attn_logit_softcapping": 1.0,
                          "gemma2.final_logit_softcapping": 2.0}, {},
               {"sliding window": {"swa_layers": (False,) * 4}, "attention softcap": {"attn_softcap": 0.0},
                "final softcap": {"final_logit_softcap": 0.0}}),
    "olmo2": ("olmo2", {"olmo2.attention.sliding_window": 8}, {}, {"sliding window": {"swa_layers": (False,) * 4}}),
    "granite": ("granite", {"granite.embedding_scale": 3.0, "granite.residual_scale": 0.4,
                            "granite.attention.scale": 0.6, "granite.logit_scale": 4.0}, {},
                {"embedding_scale": {"embed_scale": 1.0}, "residual_scale": {"residual_scale": 1.0},
                 "attention.scale": {"attn_scale": 0.0}, "logit_scale": {"logit_scale": 1.0}}),
    "smollm3": ("smollm3", {}, {}, {"no-rope layers": {"nope_layers": ()}}),
    "qwen3moe": ("qwen3moe", {}, {}, {"top-k": {"n_experts_used": 2}, "weights norm": {"expert_weights_norm": False}}),
    "qwen2moe": ("qwen2moe", {}, {}, {"top-k": {"n_experts_used": 1}, "weights norm": {"expert_weights_norm": True},
                                      "shared expert": {"shared_ffn_dim": 0, "ignored_tensors": ("*shexp*",)}}),
    "olmoe": ("olmoe", {}, {}, {"top-k": {"n_experts_used": 1}}),
    "mixtral": ("llama", {}, {}, {"top-k": {"n_experts_used": 1}}),
    "granitemoe": ("granitemoe", {"granitemoe.embedding_scale": 3.0, "granitemoe.residual_scale": 0.4,
                                  "granitemoe.attention.scale": 0.6, "granitemoe.logit_scale": 4.0}, {},
                   {"top-k": {"n_experts_used": 1}, "residual_scale": {"residual_scale": 1.0},
                    "shared expert": {"shared_ffn_dim": 0, "ignored_tensors": ("*shexp*",)}}),
    "ernie4_5": ("ernie4_5", {}, {}, {"rope pairs": {"rope_neox": True}}),
    # the first layer dense, then experts chosen with a selection bias, and a shared expert
    "ernie4_5-moe": ("ernie4_5-moe", {"ernie4_5-moe.interleave_moe_layer_step": 1,
                                      "ernie4_5-moe.leading_dense_block_count": 1}, {},
                     {"top-k": {"n_experts_used": 1},
                      "selection bias": {"expert_select_bias": False, "ignored_tensors": ("*exp_probs_b*",)}}),
    "exaone4": ("exaone4", {}, {}, {"rope pairs": {"rope_neox": False},
                                    "qk norm": {"qk_norm": False, "ignored_tensors": ("*attn_[qk]_norm*",)}}),
    "glm4": ("glm4", {}, {}, {"rope pairs": {"rope_neox": True},
                              "post norms": {"post_norms": False, "ignored_tensors": ("*post_*",)}}),
    "seed_oss": ("seed_oss", {}, {}, {"rope pairs": {"rope_neox": False}}),
    # xIELU's raw parameters per layer (a large alpha_p: the positive branch's square bites)
    "apertus": ("apertus", {"xielu.alpha_n": [0.8, 0.3, -0.5, 1.2], "xielu.alpha_p": [2.0, 1.5, 0.4, 3.0],
                            "xielu.beta": [0.5, 0.5, 0.5, 0.5], "xielu.eps": [-1e-6, -1e-6, -1e-6, -1e-6]}, {},
                {"output bias": {"attn_out_bias": False, "ignored_tensors": ("*attn_output.bias",)},
                 "rope pairs": {"rope_neox": False}}),
    # a sliding window in the metadata: no RoPE on layer 0 (the window itself is 4096)
    "smallthinker": ("smallthinker", {"smallthinker.expert_gating_func": 1, "smallthinker.attention.sliding_window": 8},
                     {}, {"router on input": {"router_on_input": False}, "no-rope layers": {"nope_layers": ()},
                          "ReGLU experts": {"expert_activation": "silu"}, "top-k": {"n_experts_used": 1}}),
    "smallthinker-sigmoid": ("smallthinker", {"smallthinker.expert_gating_func": 2}, {},
                             {"sigmoid": {"expert_gating": "softmax"}}),
    # sliding windows on even layers, sinks, biases everywhere, the clamped SwiGLU
    "gpt-oss": ("gpt-oss", {"gpt-oss.attention.sliding_window": 8}, {},
                {"sinks": {"attn_sinks": False, "ignored_tensors": ("*attn_sinks*",)},
                 "sliding window": {"swa_layers": (False,) * 4}, "top-k": {"n_experts_used": 1},
                 "softmax over the chosen": {"expert_gating": "softmax"},
                 "clamped SwiGLU": {"expert_activation": "silu"},
                 "expert biases": {"expert_biases": False, "ignored_tensors": ("*exps.bias", "*gate_inp.bias")}}),
    "hunyuan-dense": ("hunyuan-dense", {"hunyuan-dense.rope.scaling.alpha": 50.0}, {},
                      {"norm after rope": {"qk_norm_after_rope": False}, "rope alpha": {"rope_base": 10000.0}}),
}
# the MoE cases' (E experts, k used, expert width; shared expert width), F32 and quantized
# (llama and olmoe read the experts' width from feed_forward_length, as llama.cpp does)
MOE_SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "qwen3moe": (dict(experts=(8, 3, 32)), dict(experts=(8, 3, 256))),
    "qwen2moe": (dict(experts=(8, 2, 32), shared_ffn=48), dict(experts=(8, 2, 256), shared_ffn=256)),
    "olmoe": (dict(experts=(8, 2, 128), ffn=128, n_kv_heads=4), dict(experts=(8, 2, 256), ffn=256, n_kv_heads=16)),
    "mixtral": (dict(experts=(8, 2, 128), ffn=128), dict(experts=(8, 2, 256), ffn=256)),
    "granitemoe": (dict(experts=(8, 2, 128), ffn=128, shared_ffn=48), dict(experts=(8, 2, 256), ffn=256, shared_ffn=256)),
    "ernie4_5-moe": (dict(experts=(8, 2, 32), shared_ffn=48), dict(experts=(8, 2, 256), shared_ffn=256)),
    "gpt-oss": (dict(experts=(8, 2, 32)), dict(experts=(8, 2, 256))),
    "smallthinker": (dict(experts=(8, 2, 32), n_layers=5), dict(experts=(8, 2, 256), n_layers=5)),
    # a narrow router: larger logits saturate float32 sigmoids to exactly 1.0, a tie whose order
    # is the sort's (ours: the lower expert; ggml's argsort does not promise one)
    "smallthinker-sigmoid": (dict(experts=(8, 2, 32), router_std=0.1), dict(experts=(8, 2, 256), router_std=0.1)),
}
# partial rotary (glm4: half of each head, in the normal pair order)
ROT_SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {"glm4": (dict(n_rot=8), dict(n_rot=8))}


def write(tmp: Path, name: str, qtype: str = "F32", **overrides: Any) -> Path:
    arch, meta, factors, _ = CASES[name]
    wide = qtype != "F32"  # K-quants need rows of 256
    # head_dim 16 either way; the quantized models' logits are softer (std ~2, as real models'
    # are): the F32 ones' (std ~4) make every rounding difference a large KL
    shape: dict[str, Any] = dict(d_model=256, ffn=512, n_heads=16, output_std=0.25) if wide else {}
    if name in MOE_SHAPES:
        shape.update(MOE_SHAPES[name][wide])
    if name in ROT_SHAPES:
        shape.update(ROT_SHAPES[name][wide])
    shape.update(overrides)
    return write_arch_model(tmp / f"{name}-{qtype}.gguf", arch, qtype=qtype, meta=meta, factors=factors, **shape)
