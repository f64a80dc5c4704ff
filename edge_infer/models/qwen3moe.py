"""qwen3moe architecture (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (per-head QK
norm, NEOX RoPE, no biases) and a mixture-of-experts FFN in every layer; the chosen experts'
weights are normalised to sum to 1 (llama.cpp's norm_w for this architecture)."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "qwen3moe"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qk_norm=True, **MetadataReader(f, ARCH).experts(norm=True))
