"""hunyuan-dense architecture (Tencent Hunyuan 0.5B / 1.8B / 4B / 7B dense): llama's block with RoPE
in NEOX order over the whole head and a per-head RMSNorm of Q and K applied after RoPE (qwen3 norms
before it); `rope.scaling.alpha`, when set, scales the rope base by alpha^(d / (d - 2)) (NTK-aware,
d the head size), as llama.cpp reads it. The vision variants' M-RoPE sections are refused by
name. llama.cpp: src/models/hunyuan-dense.cpp (hunyuan-vl.cpp's loader and graph)."""

from __future__ import annotations

import numpy as np

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "hunyuan-dense"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    md.refuse_mrope()
    d_model, n_heads = md.get("embedding_length"), md.get("attention.head_count")
    head_dim = md.get("attention.key_length", d_model // n_heads)
    base = md.get("rope.freq_base", 10000.0, float)
    alpha = md.get("rope.scaling.alpha", 0.0, float)
    if alpha > 0:  # in float32, as llama.cpp's powf
        base = float(np.float32(base) * np.power(np.float32(alpha), np.float32(head_dim / (head_dim - 2))))
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qk_norm=True, qk_norm_after_rope=True, rope_base=base,
                                  rope_base_swa=base)
