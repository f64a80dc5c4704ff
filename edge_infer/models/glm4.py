"""glm4 architecture (GLM-4-0414 9B / 32B, GLM-Z1): llama's pre-norms plus a norm after attention
(post_attention_norm) and after the FFN (post_ffw_norm), Q/K/V biases, RoPE in the normal pair
order over the first rope.dimension_count dims of each head (half of it), and the FFN's gate and
up projections fused in ffn_up (rows [gate | up]). Multi-token-prediction layers
(`nextn_predict_layers`) are not run, as llama.cpp's main pass does not; the vision variants'
M-RoPE (`rope.dimension_sections`) is refused by name. llama.cpp: src/models/glm4.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "glm4"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    md.refuse_mrope()
    blocks = md.get("block_count")
    n_layers = blocks - md.get("nextn_predict_layers", 0)
    if n_layers < 1:
        raise UnsupportedModelError(f"{f.path}: {ARCH} has no layers besides its multi-token-prediction ones")
    return llama.config_from_gguf(
        f,
        ARCH,
        post_norms=True,
        fused_gate_up=True,
        n_layers=n_layers,
        swa_layers=(False,) * n_layers,
        ignored_tensors=tuple(f"blk.{i}.*" for i in range(n_layers, blocks)),
    )
