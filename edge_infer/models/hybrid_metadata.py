"""Metadata the hybrid architectures share: per-layer counts (a layer's kind is often its entry
of `attention.head_count_kv` or `feed_forward_length`, 0 meaning "not this kind") and the Mamba2
block's shape keys (llama.cpp's LLM_KV_SSM_*)."""

from __future__ import annotations

from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.metadata import MetadataReader


def per_layer(f: GGUFFile, arch: str, key: str, n_layers: int) -> list[int]:
    """`<arch>.<key>` per layer: an array of non-negative integers, or one for every layer."""
    full = f"{arch}.{key}"
    v = f.metadata.get(full)
    values: list[Any] = v if isinstance(v, list) else [v] * n_layers
    if len(values) != n_layers or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in values):
        raise UnsupportedModelError(f"{f.path}: metadata {full!r} must hold {n_layers} non-negative integers, got {v!r}")
    return values


def layer_kv_heads(f: GGUFFile, arch: str, n_layers: int) -> list[int]:
    """`attention.head_count_kv` per layer (0 = a layer without attention)."""
    return per_layer(f, arch, "attention.head_count_kv", n_layers)


def mamba2_shape(md: MetadataReader) -> dict[str, int]:
    """ModelConfig's Mamba2 fields from `ssm.*`: the convolution's width, d_inner, the state
    size, the heads (time_step_rank) and the groups of B and C."""
    return dict(ssm_conv_kernel=md.get("ssm.conv_kernel"), ssm_inner=md.get("ssm.inner_size"),
                ssm_state=md.get("ssm.state_size"), ssm_heads=md.get("ssm.time_step_rank"),
                ssm_groups=md.get("ssm.group_count"))
