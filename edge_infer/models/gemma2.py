"""gemma2 architecture (Gemma 2): embeddings scaled by sqrt(d_model), norms after attention and
after the FFN besides the ones before, GeGLU (tanh GELU), RoPE in NEOX order, softcapping of
the attention scores (`attn_logit_softcapping`, default 50) and of the final logits
(`final_logit_softcapping`, default 30), and sliding-window attention (`sliding_window`,
default 4096) on the even layers. The output matrix is always the token embedding. GGUF stores
the norm weights with gemma's +1 already added."""

from __future__ import annotations

import math

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "gemma2"
DEFAULT_WINDOW = 4096
LAYERS_27B = 46  # the 27B scales queries by 1/sqrt(d_model / n_heads), the others by 1/sqrt(head_dim)


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    d_model = md.get("embedding_length")
    n_heads = md.get("attention.head_count")
    head_dim = md.get("attention.key_length", d_model // n_heads)
    window = md.get("attention.sliding_window", DEFAULT_WINDOW)
    return llama.config_from_gguf(
        f,
        ARCH,
        rope_neox=True,
        post_norms=True,
        activation="gelu",
        embed_scale=math.sqrt(d_model),
        attn_scale=1.0 / math.sqrt(d_model // n_heads if n_layers == LAYERS_27B else head_dim),
        sliding_window=window,
        swa_layers=tuple(window > 0 and i % 2 == 0 for i in range(n_layers)),
        attn_softcap=md.get("attn_logit_softcapping", 50.0, float),
        final_logit_softcap=md.get("final_logit_softcapping", 30.0, float),
        tied_embeddings=True,
    )
