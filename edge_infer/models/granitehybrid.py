"""granitehybrid architecture (IBM Granite 4.0-H: Micro, Tiny, Small; Bamba): Mamba2 blocks
beside a few GQA attention layers, each followed by a SwiGLU FFN (or a mixture of experts, not
its experts' weights normalised to sum to 1, beside an ungated shared expert), all pre-normed. A layer's kind is its entry of `attention.head_count_kv`: 0 for
Mamba2. Granite's multipliers (embedding, residual, attention and logit scales) apply when the
file has them; the attention layers use RoPE in the normal pair order unless
`rope.scaling.finetuned` is false (Granite 4.0-H: no positional encoding). The Mamba2 shape
comes from `ssm.*` (conv_kernel, inner_size, state_size, time_step_rank = heads, group_count).
llama.cpp: src/models/granite-hybrid.cpp, mamba-base.cpp (build_mamba2_layer)."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.hybrid_metadata import layer_kv_heads, mamba2_shape
from edge_infer.models.metadata import MetadataReader

ARCH = "granitehybrid"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    experts: dict[str, object] = {}
    if md.get("expert_count", 0):  # Granite 4.0-H Tiny, Small: experts of feed_forward_length width
        shared = md.get("expert_shared_feed_forward_length", 0) > 0
        experts = dict(md.experts(norm=True, shared=shared), expert_ffn_dim=md.get("feed_forward_length"),
                       expert_weights_norm=True, shared_expert_gated=False)
    counts = layer_kv_heads(f, ARCH, n_layers)
    attn = sorted({c for c in counts if c})
    if len(attn) > 1:
        raise UnsupportedModelError(f"{f.path}: {ARCH}.attention.head_count_kv {counts} gives its attention layers "
                                    "different KV head counts")
    rope_on = bool(f.metadata.get(f"{ARCH}.rope.scaling.finetuned", True))

    def scale(key: str) -> float:
        v = md.get(key, 0.0, float)
        return v if v else 1.0  # llama.cpp: 0 (absent) means no multiplier

    return llama.config_from_gguf(
        f,
        ARCH,
        n_kv_heads=attn[0] if attn else md.get("attention.head_count"),
        embed_scale=scale("embedding_scale"),
        residual_scale=scale("residual_scale"),
        attn_scale=md.get("attention.scale", 0.0, float),
        logit_scale=scale("logit_scale"),
        nope_layers=() if rope_on else (True,) * n_layers,
        ssm_layers=tuple(c == 0 for c in counts),
        **mamba2_shape(md),
        **experts,
    )
