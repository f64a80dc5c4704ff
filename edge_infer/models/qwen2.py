"""qwen2 architecture (Qwen2 / Qwen2.5 and their coder variants): llama's block with biases on
the Q, K and V projections and RoPE in NEOX pair order; YaRN (Qwen2.5's long-context setting:
`rope.scaling.type = yarn`, factor, original context length) as ggml computes it."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig

ARCH = "qwen2"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qkv_bias=True)
