"""seed_oss architecture (ByteDance Seed-OSS-36B): llama's block with RoPE in NEOX order over the
whole head (head_dim from attention.key_length, usually not width / heads), Q/K/V biases, and
the FFN's pre-norm named post_attention_norm. The softmax scale is always 1/sqrt(head_dim)
(llama.cpp reads no attention.scale here). llama.cpp: src/models/seed-oss.cpp."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig

ARCH = "seed_oss"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return llama.config_from_gguf(f, ARCH, rope_neox=True, ffn_norm_tensor="post_attention_norm")
