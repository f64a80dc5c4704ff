"""apertus architecture (Swiss AI Apertus 8B / 70B): llama's pre-norms with a per-head QK RMSNorm
before RoPE in NEOX order, an attention-output bias when the file has one, and an ungated FFN,
down(xIELU(up x)). xIELU's parameters are per layer, metadata arrays (or one value for all) under
`xielu.alpha_n`, `xielu.alpha_p`, `xielu.beta`, `xielu.eps` (not prefixed by the architecture),
stored raw: ggml's op applies softplus to the alphas (alpha_n = beta + softplus(raw_n), alpha_p =
softplus(raw_p), in float32). The QK norms' biases llama.cpp loads and never applies are ignored.
The output matrix is required (no tied embeddings). llama.cpp: src/models/apertus.cpp."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import llama
from edge_infer.models.config import ModelConfig
from edge_infer.models.metadata import MetadataReader

ARCH = "apertus"
XIELU_KEYS = ("xielu.alpha_n", "xielu.alpha_p", "xielu.beta", "xielu.eps")


def _softplus(x: np.float32) -> np.float32:
    """ggml_compute_softplus_f32: x above 20 as it is, else log(1 + exp(x)), in float32."""
    return x if x > 20.0 else np.float32(math.log(np.float32(1.0) + np.float32(math.exp(x))))


def _per_layer(f: GGUFFile, key: str, n_layers: int) -> list[np.float32]:
    v: Any = f.metadata.get(key)
    values = v if isinstance(v, list) else [v] * n_layers
    if len(values) != n_layers or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
        raise UnsupportedModelError(f"{f.path}: metadata {key!r} must hold a number or {n_layers} numbers, got {v!r}")
    return [np.float32(x) for x in values]


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    md = MetadataReader(f, ARCH)
    n_layers = md.get("block_count")
    if "output.weight" not in f.tensors:
        raise UnsupportedModelError(f"{f.path}: {ARCH} needs its output matrix (output.weight), as llama.cpp does")
    raw_n, raw_p, beta, eps = (_per_layer(f, key, n_layers) for key in XIELU_KEYS)
    params = tuple((float(b + _softplus(n)), float(_softplus(p)), float(b), float(e))
                   for n, p, b, e in zip(raw_n, raw_p, beta, eps))
    return llama.config_from_gguf(f, ARCH, rope_neox=True, qk_norm=True, activation="xielu", xielu=params,
                                  attn_out_bias=True, ignored_tensors=("blk.*.attn_[qk]_norm.bias",))
