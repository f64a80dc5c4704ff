"""falcon-h1 architecture (TII Falcon-H1 0.5B..34B, Falcon-H1R): in every layer attention and a
Mamba2 block read the same pre-normed input (attn_norm) and their outputs are summed into the
residual, then a pre-normed SwiGLU FFN. Attention is GQA with RoPE in NEOX order; the Mamba2
block is granitehybrid's (`ssm.*` shapes), its grouped norm optional (`ssm_norm.weight` absent:
y * silu(z) as it is). Falcon-H1's muP multipliers are folded into the weights by the converter
(convert_hf_to_gguf's FalconH1Model), so none apply here. The FFN's pre-norm is stored as
`blk.N.ffn_norm` without ".weight" (gguf-py maps pre_ff_layernorm.weight whole).
llama.cpp: src/models/falcon-h1.cpp, mamba-base.cpp (build_mamba2_layer)."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.hybrid_metadata import mamba2_shape
from edge_infer.models.metadata import MetadataReader

ARCH = "falcon-h1"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    return llama.config_from_gguf(
        f,
        ARCH,
        rope_neox=True,
        parallel_ssm=True,
        ssm_layers=(True,) * n_layers,
        **mamba2_shape(md),
    )
