"""gemma3 architecture: embeddings scaled by sqrt(d_model), RMSNorm on Q and K per head
(QK-norm), norms after attention and after the FFN, GeGLU (tanh GELU), RoPE in NEOX order,
and sliding-window attention on 5 of every 6 layers with its own rope base (10000 unless the
file says otherwise). GGUF stores gemma's norm weights with the +1 already added."""

from __future__ import annotations

import math

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "gemma3"
SWA_PATTERN = 6  # layer i is local unless i % 6 == 5


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    window = md.get("attention.sliding_window", 0)
    pattern = md.get("attention.sliding_window_pattern", SWA_PATTERN)
    swa = tuple(window > 0 and (pattern == 0 or i % pattern < pattern - 1) for i in range(n_layers))
    d_model = md.get("embedding_length")
    n_heads = md.get("attention.head_count")
    head_dim = md.get("attention.key_length", d_model // n_heads)
    # gemma's query scale: 1/sqrt(head_dim), except the 27B (62 layers) uses d_model / n_heads
    q_scale = 1.0 / math.sqrt(d_model // n_heads if n_layers == 62 else head_dim)
    return llama.config_from_gguf(
        f,
        ARCH,
        rope_neox=True,
        qk_norm=True,
        post_norms=True,
        activation="gelu",
        embed_scale=math.sqrt(d_model),
        attn_scale=q_scale,
        sliding_window=window,
        swa_layers=swa,
        rope_base_swa=md.get("rope.freq_base_swa", 10000.0, float),
        swa_rope_unscaled=True,
        final_logit_softcap=md.get("final_logit_softcapping", 0.0, float),
    )
