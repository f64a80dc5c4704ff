"""qwen3next architecture (Qwen3-Next-80B-A3B): qwen35moe's layers (models/qwen35.py: three Gated
DeltaNet blocks to every gated full-attention layer, a softmax top-k mixture of experts with a
sigmoid-gated shared expert in every layer) as the first release laid them out: the attention
layers rotate the first rope.dimension_count dims in NEOX order (no M-RoPE sections); a
DeltaNet block's value heads are grouped by key head (value head h reads key head h // (H / Hk),
where Qwen3.5's converter reorders them to tiled, h % Hk), and its beta and alpha projections are
one matrix, ssm_ba, rows per key head [b of its value heads | their a]. The early layout with
q, k, v, z fused in ssm_in is refused by name. llama.cpp: src/models/qwen3next.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import qwen35
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "qwen3next"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    if not md.get("expert_count", 0):
        raise UnsupportedModelError(f"{f.path}: {ARCH} needs experts ({ARCH}.expert_count), as llama.cpp does")
    shared = "blk.0.ffn_up_shexp.weight" in f.tensors
    experts = dict(md.experts(norm=True, shared=shared), expert_weights_norm=True)  # llama.cpp: always normalised
    if f"{ARCH}.rope.dimension_sections" in f.metadata:
        raise UnsupportedModelError(f"{f.path}: {ARCH} rotates in NEOX order; a file with rope.dimension_sections is "
                                    "a Qwen3.5 file (qwen35moe)")
    return qwen35.config_from_gguf(f, ARCH, delta_grouped=True, **experts)
