"""qwen35moe architecture (Qwen3.5 MoE: 35B-A3B, 122B-A10B, 397B-A17B): qwen35's Gated DeltaNet
and gated attention layers (models/qwen35.py) with a mixture-of-experts FFN in every layer:
softmax over the router, top k, the chosen weights normalised, plus a shared expert gated per
token by sigmoid(ffn_gate_inp_shexp) (as qwen2moe's). llama.cpp: src/models/qwen35moe.cpp."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import qwen35
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "qwen35moe"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    shared = "blk.0.ffn_up_shexp.weight" in f.tensors
    experts = dict(md.experts(norm=True, shared=shared), expert_weights_norm=True)  # llama.cpp: always normalised
    return qwen35.config_from_gguf(f, ARCH, **experts)
