"""phi3 architecture (Phi-3, Phi-3.5-mini, Phi-4-mini, Phi-4): one fused QKV matrix (rows
[Q | K | V]) and one fused gate-up matrix (`ffn_up`, rows [gate | up]: SiLU on the first half),
partial rotary RoPE in NEOX order with LongRoPE's factors (`rope_factors_long` when the context
exceeds `rope.scaling.original_context_length`, `rope_factors_short` otherwise) and cos/sin
scaled by `rope.scaling.attn_factor`. Like llama.cpp, full attention on every layer (its
`sliding_window` key is not applied)."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig

ARCH = "phi3"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return llama.config_from_gguf(f, ARCH, rope_neox=True, fused_qkv=True, fused_gate_up=True)
