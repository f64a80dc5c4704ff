"""gpt-oss architecture (OpenAI gpt-oss-20b, gpt-oss-120b): pre-normed GQA with Q/K/V and output
biases, RoPE in NEOX order (YaRN from the metadata), a learned sink logit per head in the
attention softmax (attn_sinks), sliding windows of `attention.sliding_window` tokens on every
other layer (the first of each pair; `attention.sliding_window_pattern` when given) with
`rope.freq_base_swa`; the FFN's pre-norm is named post_attention_norm, and every layer is a
mixture of experts: the router has a bias, the top k by logit are weighted by a softmax over
their logits (llama.cpp's SOFTMAX_WEIGHT), each expert's gate, up and down projections have
biases, and the activation is the clamped SwiGLU (x = min(gate, 7), (clamp(up, +-7) + 1) * x *
sigmoid(1.702 x)). The output matrix is required. The harmony chat format's channels are the
server's (its chat template renders a plain answer). llama.cpp: src/models/openai-moe.cpp."""

from __future__ import annotations

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "gpt-oss"


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    if "output.weight" not in f.tensors:
        raise UnsupportedModelError(f"{f.path}: {ARCH} needs its output matrix (output.weight), as llama.cpp does")
    experts = dict(md.experts(norm=False), expert_weights_norm=False, expert_gating="softmax_weight",
                   expert_biases=True, expert_activation="swiglu_oai")
    return llama.config_from_gguf(
        f,
        ARCH,
        rope_neox=True,
        ffn_norm_tensor="post_attention_norm",
        attn_out_bias=True,
        attn_sinks=True,
        sliding_window=md.get("attention.sliding_window"),
        swa_layers=md.swa_pattern(n_layers, 2, dense_first=False),
        rope_base_swa=md.get("rope.freq_base_swa", md.get("rope.freq_base", 10000.0, float), float),
        **experts,
    )
