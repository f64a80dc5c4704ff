"""lfm2 architecture (Liquid's LFM2 / LFM2.5 dense models): a hybrid of gated short
convolutions and attention. Every layer is pre-normed (attn_norm, llama.cpp's operator_norm)
with a SwiGLU FFN; most layers are a short-convolution block (in_proj to [b | c | x], a causal
depthwise convolution of b * x over the last `shortconv.l_cache` tokens, times c, out_proj), the
rest GQA attention with per-head QK RMSNorm and RoPE in NEOX order. A layer's kind is its entry
of `attention.head_count_kv`: 0 for a convolution. The final norm is `token_embd_norm.weight`.
llama.cpp: src/models/lfm2.cpp."""

from __future__ import annotations

from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.hybrid_metadata import layer_kv_heads
from edge_infer.models.metadata import MetadataReader

ARCH = "lfm2"


def config_from_gguf(f: GGUFFile, arch: str = ARCH, **overrides: Any) -> ModelConfig:
    """lfm2's config; lfm2moe passes its arch and mixture-of-experts fields."""
    md = MetadataReader(f, arch)
    n_layers = md.get("block_count")
    if not md.get("attention.causal", True, bool):
        raise UnsupportedModelError(f"{f.path}: a bidirectional {arch} (an embedding model) is not supported")
    counts = layer_kv_heads(f, arch, n_layers)
    attn = sorted({c for c in counts if c})
    if len(attn) != 1:
        raise UnsupportedModelError(
            f"{f.path}: {arch}.attention.head_count_kv {counts} must give its attention layers one KV head count"
        )
    conv = tuple(c == 0 for c in counts)
    window = md.get("attention.sliding_window", 0)
    return llama.config_from_gguf(
        f,
        arch,
        n_kv_heads=attn[0],
        rope_neox=True,
        qk_norm=True,
        conv_layers=conv,
        conv_kernel=md.get("shortconv.l_cache"),
        output_norm_tensor="token_embd_norm.weight",
        sliding_window=window,
        swa_layers=tuple(window > 0 and not c for c in conv),
        **overrides,
    )
