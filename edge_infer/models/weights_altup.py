"""gemma3n's AltUp and LAuReL weights (weights.py loads a layer; this names and checks what they
take from the file, in llama.cpp's names and shapes): globally altup_proj and altup_unembd_proj
[A - 1, D, D] (stream 0 to stream k and back); per layer the router [A, D] and its norm, the
prediction [A*A, A] and correction [A, A] coefficients, the correction's output scale [D], and
LAuReL's low-rank pair laurel_l [R, D], laurel_r [D, R] with its post-norm."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights_recurrent import TensorSource


@dataclass(slots=True)
class AltUpLayer:
    """One layer's AltUp vectors (its router and LAuReL matrices are the layer's): router_norm
    f32 [D] (with the router's 1 / D input scale folded in), predict f32 [A*A, A], correct f32
    [A, A], correct_scale f32 [D], laurel_norm f32 [D]."""

    router_norm: np.ndarray
    predict: np.ndarray
    correct: np.ndarray
    correct_scale: np.ndarray
    laurel_norm: np.ndarray


def load_altup_layer(t: TensorSource, cfg: ModelConfig, i: int) -> tuple[QMatrix, QMatrix, QMatrix, AltUpLayer]:
    """Layer i's AltUp router, LAuReL's laurel_l and laurel_r, and its vectors."""
    p, d, a, r = f"blk.{i}.", cfg.d_model, cfg.altup_streams, cfg.laurel_rank
    router = t.mat(p + "altup_router.weight", a, d)
    laurel_l, laurel_r = t.mat(p + "laurel_l.weight", r, d), t.mat(p + "laurel_r.weight", d, r)
    return router, laurel_l, laurel_r, AltUpLayer(
        router_norm=t.vec(p + "altup_router_norm.weight", d) * np.float32(1.0 / d),
        predict=t.vec(p + "altup_predict_coef.weight", a * a * a).reshape(a * a, a),
        correct=t.vec(p + "altup_correct_coef.weight", a * a).reshape(a, a),
        correct_scale=t.vec(p + "altup_correct_scale.weight", d),
        laurel_norm=t.vec(p + "laurel_post_norm.weight", d),
    )


def load_altup_projections(t: TensorSource, cfg: ModelConfig) -> tuple[list[QMatrix], list[QMatrix]]:
    """altup_proj and altup_unembd_proj, each as A - 1 [D, D] matrices (zero-copy slices)."""
    d, k = cfg.d_model, cfg.altup_streams - 1
    out = []
    for name in ("altup_proj.weight", "altup_unembd_proj.weight"):
        stack = t.stack(name, k, d, d)
        out.append([QMatrix(stack.name, stack.data[j], stack.qtype, d, d) for j in range(k)])
    return out[0], out[1]
