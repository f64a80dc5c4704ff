"""lfm2moe architecture (Liquid's LFM2-8B-A1B, LFM2-24B-A2B): lfm2's short convolutions and
attention layers (models/lfm2.py) with a mixture of experts after the first
`leading_dense_block_count` layers (those keep lfm2's dense SwiGLU). The router's probabilities
are sigmoid(logits) (`expert_gating_func` 2; 1 is the softmax); the experts are chosen by
probability + the per-expert bias `exp_probs_b.bias` and weighted by the unbiased probability,
normalised to sum to 1 (llama.cpp always normalises here). llama.cpp: src/models/lfm2moe.cpp
(its graph is lfm2.cpp's)."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import lfm2
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "lfm2moe"
GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's llama_expert_gating_func_type


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    gating = md.get("expert_gating_func")
    if gating not in GATING:
        raise UnsupportedModelError(f"{f.path}: {ARCH}.expert_gating_func = {gating} is not supported "
                                    f"(1: softmax, 2: sigmoid)")
    experts = dict(md.experts(norm=True), expert_weights_norm=True, expert_gating=GATING[gating],
                   expert_select_bias=True, dense_lead=md.get("leading_dense_block_count", 0))
    return lfm2.config_from_gguf(f, ARCH, **experts)
