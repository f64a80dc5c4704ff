"""granite architecture (IBM Granite 3.x dense): llama's block with four multipliers, all
required: `embedding_scale` on the embeddings, `residual_scale` on each block output before its
residual add, `attention.scale` as the softmax scale, and the logits divided by `logit_scale`.
`rope.scaling.finetuned = false` turns RoPE off."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "granite"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    rope_on = bool(f.metadata.get(f"{ARCH}.rope.scaling.finetuned", True))
    return llama.config_from_gguf(
        f,
        ARCH,
        embed_scale=md.get("embedding_scale", kind=float),
        residual_scale=md.get("residual_scale", kind=float),
        attn_scale=md.get("attention.scale", kind=float),
        logit_scale=md.get("logit_scale", kind=float),
        nope_layers=() if rope_on else (True,) * n_layers,
    )
