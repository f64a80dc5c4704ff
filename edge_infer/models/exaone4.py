"""exaone4 architecture (LG EXAONE 4.0: 1.2B, 32B): no norms before attention or the FFN; a norm
after each (post_attention_norm, post_ffw_norm) before its residual add, as olmo2; per-head QK
RMSNorm before RoPE in NEOX order. As llama.cpp, only a 64-layer model (the 32B) has sliding
windows: three of every four layers attend `attention.sliding_window` tokens (4096 when absent;
`attention.sliding_window_pattern` when given) and the fourth, global, has no RoPE. Q's width
must equal the model's (attn_output is square). Multi-token-prediction layers are not run.
llama.cpp: src/models/exaone4.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "exaone4"
SWA_LAYERS = 64  # llama.cpp turns sliding windows on for this layer count only


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    blocks = md.get("block_count")
    n_layers = blocks - md.get("nextn_predict_layers", 0)
    d_model, n_heads = md.get("embedding_length"), md.get("attention.head_count")
    if n_layers < 1 or n_heads * md.get("attention.key_length", d_model // n_heads) != d_model:
        raise UnsupportedModelError(f"{f.path}: {ARCH} needs layers and heads x head_dim equal to the width {d_model}")
    swa, window = (False,) * n_layers, 0
    if n_layers == SWA_LAYERS:
        window = md.get("attention.sliding_window", 4096)
        swa = md.swa_pattern(n_layers, 4, dense_first=False)
    return llama.config_from_gguf(
        f,
        ARCH,
        pre_norms=False,
        post_norms=True,
        qk_norm=True,
        rope_neox=True,
        n_layers=n_layers,
        sliding_window=window,
        swa_layers=swa,
        nope_layers=tuple(not s for s in swa) if window else (),
        ignored_tensors=tuple(f"blk.{i}.*" for i in range(n_layers, blocks)),
    )
