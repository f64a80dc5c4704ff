"""nemotron_h architecture (NVIDIA Nemotron-H 4B/8B/47B/56B, Nemotron Nano 9B/12B v2): every
layer is one pre-normed (attn_norm) block and its residual add: a Mamba2 block (granitehybrid's,
`ssm.*` shapes), GQA attention without positional encoding, or an ungated FFN, down(relu(up
x)^2). A layer's kind comes from two per-layer arrays: `attention.head_count_kv` > 0 is
attention, `feed_forward_length` > 0 an FFN, both 0 Mamba2. The softmax scale is always
1/sqrt(head_dim) (llama.cpp reads no attention.scale here). The MoE sizes (Nemotron 3 Nano,
Super) are the separate `nemotron_h_moe` architecture. llama.cpp: src/models/nemotron-h.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.hybrid_metadata import layer_kv_heads, mamba2_shape, per_layer
from edge_infer.models.metadata import MetadataReader

ARCH = "nemotron_h"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    if md.get("expert_count", 0):
        raise UnsupportedModelError(f"{f.path}: a {ARCH} file with experts is not supported (the MoE sizes are "
                                    "nemotron_h_moe files)")
    kv, ff = layer_kv_heads(f, ARCH, n_layers), per_layer(f, ARCH, "feed_forward_length", n_layers)
    both = [i for i in range(n_layers) if kv[i] and ff[i]]
    attn, widths = sorted({c for c in kv if c}), sorted({w for w in ff if w})
    if both or len(attn) > 1 or len(widths) > 1:
        raise UnsupportedModelError(
            f"{f.path}: {ARCH} layers must each be attention (one KV head count), an FFN (one width) or Mamba2: "
            f"head_count_kv {kv}, feed_forward_length {ff}")
    eps = md.get("attention.layer_norm_rms_epsilon", md.get("attention.layer_norm_epsilon", 1e-5, float), float)
    return llama.config_from_gguf(
        f,
        ARCH,
        n_kv_heads=attn[0] if attn else md.get("attention.head_count"),
        ffn_dim=widths[0] if widths else 1,
        norm_eps=eps,
        activation="relu2",
        nope_layers=(True,) * n_layers,
        ssm_layers=tuple(not k and not w for k, w in zip(kv, ff)),
        ffn_only_layers=tuple(w > 0 for w in ff),
        mixer_only_layers=tuple(w == 0 for w in ff),
        **mamba2_shape(md),
    )
