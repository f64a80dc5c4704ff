"""llama architecture (Llama 2/3.x, SmolLM2, Mistral, TinyLlama): RMSNorm, SwiGLU, GQA/MQA, RoPE
in GGUF's "normal" pair order (the converter permutes Q/K rows for it), tied embeddings when
`output.weight` is absent, optional Q/K/V biases. Llama 3.1+ files carry their rope scaling as
the frequency divisors of `rope_freqs.weight`; a `sliding_window` in the metadata (Mistral v0.1)
limits every layer's attention to that many tokens (llama.cpp ignores the key: full attention).
With `expert_count` > 0 (Mixtral) every FFN is a mixture of experts of feed_forward_length
width, the chosen experts' weights normalised to sum to 1."""

from __future__ import annotations

from typing import Any

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "llama"


def config_from_gguf(f: GGUFFile, arch: str = ARCH, **overrides: object) -> ModelConfig:
    """The shared reader of llama-like metadata; other architectures pass their overrides."""
    md = MetadataReader(f, arch)
    d_model = md.get("embedding_length")
    n_heads = md.get("attention.head_count")
    head_dim = md.get("attention.key_length", d_model // n_heads)
    n_layers = md.get("block_count")
    window = md.get("attention.sliding_window", 0) if arch == ARCH else 0
    fields: dict[str, Any] = dict(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        # a hybrid model passes its own (its file holds one count per layer)
        n_kv_heads=overrides.pop("n_kv_heads", None) or md.get("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        ffn_dim=overrides.pop("ffn_dim", None) or md.get("feed_forward_length"),  # nemotron_h: per layer
        vocab_size=md.vocab_size(),
        context_length=md.get("context_length"),
        norm_eps=md.get("attention.layer_norm_rms_epsilon", 1e-5, float),
        rope_base=md.get("rope.freq_base", 10000.0, float),
        **md.rope_scaling(),
        rope_freqs=md.factors("rope_freqs.weight"),
        rope_factors_long=md.factors("rope_factors_long.weight"),
        rope_factors_short=md.factors("rope_factors_short.weight"),
        n_rot=md.get("rope.dimension_count", head_dim),
        sliding_window=window,
        swa_layers=(window > 0,) * n_layers,
        tied_embeddings="output.weight" not in f.tensors,
        pooling=md.pooling(),
    )
    fields["rope_base_swa"] = fields["rope_base"]
    if arch == ARCH and md.get("expert_count", 0) > 0:
        fields.update(md.experts(norm=True), expert_ffn_dim=md.get("feed_forward_length"))
    fields.update(overrides)
    return ModelConfig(**fields)
