"""qwen3 architecture (Qwen3 dense): llama's block without biases, RMSNorm of each head of Q and
K before RoPE (QK-norm), RoPE in NEOX pair order; YaRN when the file sets it."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig

ARCH = "qwen3"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qk_norm=True)
