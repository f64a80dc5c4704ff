"""gemma4's per-layer embedding input (PLE; weights.py loads a layer, this the tensors of the
small per-layer embedding each layer mixes back into its output, in llama.cpp's names and
shapes): per_layer_token_embd [V', L * P] (one P-wide input per token and layer, V' >= the
vocabulary: the converter pads it), per_layer_model_proj [L * P, D] and per_layer_proj_norm
[P], and per layer inp_gate [P, D], proj [D, P] and post_norm [D]."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights_recurrent import TensorSource

TOKEN_EMBD = "per_layer_token_embd.weight"


def load_per_layer_input(t: TensorSource, cfg: ModelConfig, layers: list[Any]) -> tuple[QMatrix, np.ndarray]:
    """Each layer's PLE matrices into its LayerWeights (its P rows of per_layer_model_proj as a
    zero-copy slice, so each layer projects its own input); returns the token table viewed as
    one P-wide row per (token, layer) (row t * L + l: a token's row holds its L inputs one after
    another) and per_layer_proj_norm."""
    d, p, n_layers = cfg.d_model, cfg.per_layer_input, cfg.n_layers
    shape = t.shape(TOKEN_EMBD)
    if shape is None or len(shape) != 2:
        raise UnsupportedModelError(f"{cfg.arch}: missing or malformed tensor {TOKEN_EMBD!r} (shape {shape})")
    rows = shape[1]
    if rows < cfg.vocab_size:
        raise UnsupportedModelError(f"{cfg.arch}: {TOKEN_EMBD!r} has {rows} rows for a vocabulary of {cfg.vocab_size}")
    table = t.mat(TOKEN_EMBD, rows, n_layers * p)
    block = GGML_QUANT_SIZES[GGMLQuantizationType(table.qtype)][0]
    if p % block:
        raise UnsupportedModelError(f"{cfg.arch}: per-layer input width {p} is not a whole number of "
                                    f"{GGMLQuantizationType(table.qtype).name} blocks of {block}")
    per_token = table.data.reshape(rows * n_layers, table.data.shape[1] // n_layers)
    embd = QMatrix(table.name, per_token, table.qtype, rows * n_layers, p)
    proj = t.mat("per_layer_model_proj.weight", n_layers * p, d)
    for i, lw in enumerate(layers):
        pre = f"blk.{i}."
        lw.ple_in_proj = QMatrix(proj.name, proj.data[i * p : (i + 1) * p], proj.qtype, p, d)
        lw.ple_gate = t.mat(pre + "inp_gate.weight", p, d)
        lw.ple_proj = t.mat(pre + "proj.weight", d, p)
        lw.ple_norm = t.vec(pre + "post_norm.weight", d)
    return embd, t.vec("per_layer_proj_norm.weight", p)
