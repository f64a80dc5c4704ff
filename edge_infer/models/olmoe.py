"""olmoe architecture (OLMoE-1B-7B): llama's block with RMSNorms of the whole Q and K rows
before RoPE (NEOX pair order, as olmo2) and a mixture-of-experts FFN in every layer, weights not
renormalised (llama.cpp's norm_w = false); an expert's width is feed_forward_length, as llama.cpp
reads it for this architecture."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "olmoe"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    experts = md.experts(norm=False) | {"expert_ffn_dim": md.get("feed_forward_length")}
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qk_norm_full=True, **experts)
