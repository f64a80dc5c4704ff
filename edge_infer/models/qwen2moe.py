"""qwen2moe architecture (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention (Q/K/V biases,
NEOX RoPE), a mixture-of-experts FFN whose weights are not renormalised, and a shared expert
(ffn_*_shexp) added times sigmoid(x . ffn_gate_inp_shexp) per token."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "qwen2moe"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    experts = MetadataReader(f, ARCH).experts(norm=False, shared=True)
    return llama.config_from_gguf(f, ARCH, rope_neox=True, **experts)  # biases: read when present
