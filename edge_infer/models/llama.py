"""llama architecture (SmolLM2, Llama, Mistral, TinyLlama): RMSNorm, SwiGLU, GQA/MQA, RoPE in
GGUF's "normal" pair order (the converter permutes Q/K rows for it), tied embeddings when
`output.weight` is absent."""

from __future__ import annotations

from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.config import MetadataReader, ModelConfig

ARCH = "llama"


def config_from_gguf(f: GGUFFile, arch: str = ARCH, **overrides: object) -> ModelConfig:
    md = MetadataReader(f, arch)
    d_model = md.get("embedding_length")
    n_heads = md.get("attention.head_count")
    head_dim = md.get("attention.key_length", d_model // n_heads)
    n_layers = md.get("block_count")
    fields: dict[str, object] = dict(
        arch=arch,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=md.get("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        ffn_dim=md.get("feed_forward_length"),
        vocab_size=md.vocab_size(),
        context_length=md.get("context_length"),
        norm_eps=md.get("attention.layer_norm_rms_epsilon", 1e-5, float),
        rope_base=md.get("rope.freq_base", 10000.0, float),
        rope_scale=md.rope_scale(),
        n_rot=md.get("rope.dimension_count", head_dim),
        swa_layers=(False,) * n_layers,
        tied_embeddings="output.weight" not in f.tensors,
    )
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]
