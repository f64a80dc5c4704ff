"""olmo2 architecture (OLMo 2, and OLMo 3's dense models): no norms before attention or the FFN,
RMSNorm after both (post-norms), RMSNorm of the whole Q and K rows (not per head) before RoPE in
NEOX order, an untied output matrix. With a `sliding_window`, layers 0-2 of every 4 are local
(llama.cpp's fixed pattern) and rotate without rope scaling."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "olmo2"
SWA_PATTERN = 4


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    window = md.get("attention.sliding_window", 0)
    return llama.config_from_gguf(
        f,
        ARCH,
        rope_neox=True,
        pre_norms=False,
        post_norms=True,
        qk_norm_full=True,
        sliding_window=window,
        swa_layers=tuple(window > 0 and i % SWA_PATTERN < SWA_PATTERN - 1 for i in range(n_layers)),
        swa_rope_unscaled=True,
        tied_embeddings=False,
    )
