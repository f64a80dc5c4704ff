"""gemma4 architecture (Gemma 4: E2B, E4B, 26B-A4B, 31B):
gemma3's block (embeddings times sqrt(d_model), per-head QK RMSNorm, norms after attention and
after the FFN, GeGLU, NEOX RoPE, sliding windows on the layers `attention.sliding_window_pattern`
flags) with an attention scale of 1, V RMS-normed per head with no weight, and
- sliding-window layers with their own head size, KV heads and rotated dims
  (`key_length_swa`, a per-layer `head_count_kv`, `rope.dimension_count_swa`); the full layers
  rotate with `rope_freqs` (proportional RoPE: divisors of 1e30 leave the upper pairs still);
- a layer without attn_v attends with V = K's projection;
- the last `attention.shared_kv_layers` layers keep no K/V: they attend over the last earlier
  layer of their kind that does (and their MLP may be twice as wide: a per-layer
  `feed_forward_length`);
- a per-layer embedding input (`embedding_length_per_layer_input` P > 0: models/per_layer_input.py)
  and a scalar `layer_output_scale` on each layer's output;
- the logits soft-capped at 30 unless `final_logit_softcapping` says otherwise;
- with `expert_count` (26B-A4B), experts beside every layer's dense MLP (models/moe.py's
  moe_beside_dense: softmax routing, top k normalised, GeGLU experts, a scale per expert).
Norm weights are stored as they are used (no +1, unlike gemma3's). llama.cpp: src/models/gemma4.cpp."""

from __future__ import annotations

import math
from typing import Any

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.hybrid_metadata import layer_kv_heads, per_layer
from edge_infer.models.metadata import MetadataReader

ARCH = "gemma4"
SOFTCAP = 30.0  # llama.cpp's default final_logit_softcapping, kept when the key is absent


def gemma_block(md: MetadataReader, swa: tuple[bool, ...]) -> dict[str, Any]:
    """The ModelConfig fields gemma4 and gemma3n share: gemma3's block with an attention scale of
    1, V normed per head, sliding windows with their own rope base and no rope scaling."""
    return dict(rope_neox=True, qk_norm=True, post_norms=True, activation="gelu",
                embed_scale=math.sqrt(md.get("embedding_length")), attn_scale=1.0, v_norm=True,
                sliding_window=md.get("attention.sliding_window"), swa_layers=swa,
                rope_base_swa=md.get("rope.freq_base_swa", 10000.0, float), swa_rope_unscaled=True)


def _by_kind(f: GGUFFile, name: str, values: list[int], swa: tuple[bool, ...]) -> tuple[int, int]:
    """(full layers' value, sliding-window layers' value) of a per-layer count that must agree
    within each kind."""
    full = {v for v, s in zip(values, swa) if not s}
    local = {v for v, s in zip(values, swa) if s}
    if len(full) > 1 or len(local) > 1:
        raise UnsupportedModelError(f"{f.path}: {ARCH}.{name} varies within the full or sliding-window layers: {values}")
    first = values[0]
    return (full.pop() if full else first), (local.pop() if local else first)


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    key = f"{ARCH}.attention.sliding_window_pattern"
    if not isinstance(f.metadata.get(key), list):
        raise UnsupportedModelError(f"{f.path}: {ARCH} needs {key!r} as per-layer flags")
    swa = md.swa_pattern(n_layers, 0, dense_first=False)
    head_dim, head_dim_swa = md.get("attention.key_length"), md.get("attention.key_length_swa")
    if (md.get("attention.value_length", head_dim) != head_dim
            or md.get("attention.value_length_swa", head_dim_swa) != head_dim_swa):
        raise UnsupportedModelError(f"{f.path}: {ARCH} needs the key and value lengths equal")
    kv_full, kv_swa = _by_kind(f, "attention.head_count_kv", layer_kv_heads(f, ARCH, n_layers), swa)
    ffn = per_layer(f, ARCH, "feed_forward_length", n_layers)
    n_rot = md.get("rope.dimension_count", head_dim)
    shared = md.get("attention.shared_kv_layers", 0)
    if shared and n_layers - shared < 2:
        raise UnsupportedModelError(f"{f.path}: {ARCH}.attention.shared_kv_layers = {shared} of {n_layers} layers")
    experts: dict[str, Any] = {}
    if md.get("expert_count", 0):
        routed = [f"blk.{i}.ffn_gate_inp.weight" in f.tensors for i in range(n_layers)]
        if not all(routed) or shared:
            raise UnsupportedModelError(f"{f.path}: {ARCH} with experts on only some layers, or with KV-shared "
                                        "layers, is not supported")
        experts = dict(n_experts=md.get("expert_count"), n_experts_used=md.get("expert_used_count"),
                       expert_ffn_dim=md.get("expert_feed_forward_length"), expert_weights_norm=True,
                       expert_activation="gelu", moe_beside_dense=True)
    fields: dict[str, Any] = dict(
        n_kv_heads=kv_full,
        n_kv_heads_swa=kv_swa,
        head_dim=head_dim,
        head_dim_swa=head_dim_swa,
        n_rot=n_rot,
        n_rot_swa=md.get("rope.dimension_count_swa", n_rot),
        ffn_dim=ffn[0],
        layer_ffn_dims=tuple(ffn) if len(set(ffn)) > 1 else (),
        **gemma_block(md, swa),  # rope_freqs are the full layers' only
        final_logit_softcap=md.get("final_logit_softcapping", SOFTCAP, float),
        kv_shared_from=n_layers - shared if shared else 0,
        k_eq_v=True,
        per_layer_input=md.get("embedding_length_per_layer_input"),
        layer_output_scale=True,
        **experts,
    )
    return llama.config_from_gguf(f, ARCH, **fields)
