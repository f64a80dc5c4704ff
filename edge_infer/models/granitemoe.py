"""granitemoe architecture (IBM Granite 3.x MoE: 1B-A400M, 3B-A800M; PowerMoE): granite's block and
multipliers (models/granite.py; here the embedding, residual and attention ones optional, 0 or
absent meaning none, logit_scale required) with a mixture of experts in every layer: softmax over
the router, top k, the chosen weights always normalised, experts of `feed_forward_length` width,
and an ungated shared expert of `expert_shared_feed_forward_length` when that is set. Experts
without a gate stack (llama.cpp then runs silu(up) alone) are refused by name. With
`expert_count` 0 every layer keeps granite's dense FFN. llama.cpp: src/models/granite-moe.cpp
(its graph is granite.cpp's)."""

from __future__ import annotations

from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "granitemoe"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    experts: dict[str, Any] = {}
    if md.get("expert_count", 0):
        if "blk.0.ffn_gate_exps.weight" not in f.tensors:
            raise UnsupportedModelError(f"{f.path}: {ARCH} experts without a gate stack (blk.0.ffn_gate_exps.weight) "
                                        "are not supported")
        shared = md.get("expert_shared_feed_forward_length", 0) > 0
        experts = dict(md.experts(norm=True, shared=shared), expert_ffn_dim=md.get("feed_forward_length"),
                       expert_weights_norm=True, shared_expert_gated=False)

    def scale(key: str) -> float:
        v = md.get(key, 0.0, float)
        return v if v else 1.0  # llama.cpp: 0 (absent) means no multiplier

    return llama.config_from_gguf(
        f,
        ARCH,
        embed_scale=scale("embedding_scale"),
        residual_scale=scale("residual_scale"),
        attn_scale=md.get("attention.scale", 0.0, float),
        logit_scale=md.get("logit_scale", kind=float),
        **experts,
    )
