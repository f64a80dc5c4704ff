"""The hyper-parameters every text model gets from llama.cpp's converter (TextModel's
set_gguf_parameters, with its rope_parameters from TextModel.__init__) and those BertModel adds
for all its encoders (not causal, the pooling, the classifier's pooling and labels), each looked
up by the same list of config names in the same order, so the keys come out as there."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gguf import GGUFWriter, LlamaFileType, PoolingType

from edge_infer.errors import ConversionError

CTX_KEYS = ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length")
FFN_KEYS = ("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner", "hidden_dim")
ROPE_THETA_KEYS = ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base")
ROPE_LOCAL_KEYS = ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq")
PARTIAL_ROPE_KEYS = ("partial_rotary_factor", "rope_pct", "rope_percent")
# rope_type values that change nothing (llama.cpp writes no scaling keys for them)
PLAIN_ROPE = (None, "default")


def find(config: dict[str, Any], keys: Iterable[str]) -> Any:
    """The value of the first of `keys` the config has (even a null one), or None: find_hparam."""
    key = next((k for k in keys if k in config), None)
    return None if key is None else config[key]


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """TextModel.__init__'s rope_parameters: the config's (or its rope_scaling) with the global
    and local thetas mirrored in."""
    rp = dict(config.get("rope_parameters", config.get("rope_scaling")) or {})
    theta, local = find(config, ROPE_THETA_KEYS), find(config, ROPE_LOCAL_KEYS)
    partial = find(config, PARTIAL_ROPE_KEYS)
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and (kind := rp.get("type")) is not None:
            rp["rope_type"] = kind
        if "partial_rotary_factor" not in rp and partial is not None:
            rp["partial_rotary_factor"] = partial
    return rp


def check_plain_rope(path: Path, config: dict[str, Any]) -> None:
    """Refuse RoPE scaling (linear, yarn, ...) and partial rotation: the encoders here rotate
    every dimension of a head at the trained frequencies."""
    rp = rope_parameters(config)
    for part in (rp.get("full_attention", rp), rp.get("sliding_attention", {})):
        if isinstance(part, dict) and part.get("rope_type") not in PLAIN_ROPE:
            raise ConversionError(f"{path}: rope scaling {part.get('rope_type')!r} is not supported")
    if rp.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise ConversionError(f"{path}: partial_rotary_factor {rp['partial_rotary_factor']!r} is not supported")


def add_text_parameters(w: GGUFWriter, config: dict[str, Any], ftype: LlamaFileType) -> None:
    """TextModel.set_gguf_parameters for what an encoder's config can hold (check_plain_rope
    refused scaling, so no scaling keys; no experts)."""
    w.add_block_count(find(config, ("n_layers", "num_hidden_layers", "n_layer", "num_layers")))
    if (n_ctx := find(config, CTX_KEYS)) is not None:
        w.add_context_length(n_ctx)
    if (n_embd := find(config, ("hidden_size", "n_embd", "dim"))) is not None:
        w.add_embedding_length(n_embd)
    if (n_ff := find(config, FFN_KEYS)) is not None:
        w.add_feed_forward_length(n_ff)
    if (n_head := find(config, ("num_attention_heads", "n_head", "n_heads"))) is not None:
        w.add_head_count(n_head)
    if (n_kv := find(config, ("num_key_value_heads", "n_kv_heads"))) is not None:
        w.add_head_count_kv(n_kv)
    if config.get("is_causal") is False:
        w.add_causal_attention(False)
    rp = rope_parameters(config)
    if (theta := rp.get("full_attention", rp).get("rope_theta")) is not None:
        w.add_rope_freq_base(theta)
    if (local := rp.get("sliding_attention", {}).get("rope_theta")) is not None:
        w.add_rope_freq_base_swa(local)
    if (rms_eps := find(config, ("rms_norm_eps", "norm_eps"))) is not None:
        w.add_layer_norm_rms_eps(rms_eps)
    if (norm_eps := find(config, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))) is not None:
        w.add_layer_norm_eps(norm_eps)
    if (head_dim := config.get("head_dim")) is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)


def add_bert_parameters(w: GGUFWriter, arch: str, pooling: tuple[PoolingType | None, PoolingType | None],
                        labels: list[str] | None) -> None:
    """BertModel.set_gguf_parameters after TextModel's: bidirectional attention, the
    sentence-transformers pooling and the classifier's (_try_set_pooling_type), the labels."""
    w.add_causal_attention(False)
    if pooling[0] is not None:
        w.add_pooling_type(pooling[0])
    if pooling[1] is not None:
        w.add_uint32(f"{arch}.classifier.pooling_type", pooling[1].value)
    if labels:
        w.add_classifier_output_labels(labels)
