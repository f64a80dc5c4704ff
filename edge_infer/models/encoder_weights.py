"""An encoder's weights in llama.cpp's tensor names (src/models/bert.cpp's load_arch_tensors):
matrices prepared by the backend, norms, biases and the small embedding tables as float32.
Every tensor of the file is used or refused by name."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.backend import Backend
from edge_infer.models.encoder_config import EncoderConfig
from edge_infer.models.weights import Tensors, row_slices

_EMPTY = np.empty(0, np.float32)  # an absent bias: the kernels add nothing


@dataclass(slots=True)
class Norm:
    """A LayerNorm's weight and bias, float32 [D]."""

    w: np.ndarray
    b: np.ndarray


@dataclass(slots=True)
class EncoderLayer:
    """One post-norm block. Biases are float32 (empty where the file has none); w_gate is None
    for bert's ungated FFN; q_norm / k_norm / norm_2 are jina-bert-v2's optional LayerNorms."""

    wq: QMatrix
    wk: QMatrix
    wv: QMatrix
    wo: QMatrix
    w_up: QMatrix
    w_gate: QMatrix | None
    w_down: QMatrix
    bq: np.ndarray
    bk: np.ndarray
    bv: np.ndarray
    bo: np.ndarray
    b_up: np.ndarray
    b_down: np.ndarray
    attn_out_norm: Norm
    out_norm: Norm
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    norm_2: Norm | None = None

    def matrix_names(self) -> list[str]:
        return [n for n in ("wq", "wk", "wv", "wo", "w_up", "w_gate", "w_down") if getattr(self, n) is not None]


@dataclass(slots=True)
class EncoderWeights:
    """token_embd is read by rows (left as the file has it); type_row f32 [D] (token type 0's
    embedding, zeros without one); positions f32 [ctx, D] (learned positions; [0, D] without);
    cls [D, D] / cls_out [n_cls_out, D] the rank head's dense layer and classifier (None when the
    file has none)."""

    token_embd: QMatrix
    type_row: np.ndarray
    positions: np.ndarray
    input_norm: Norm
    layers: list[EncoderLayer]
    cls: QMatrix | None = None
    cls_b: np.ndarray = field(default_factory=lambda: _EMPTY)
    cls_out: QMatrix | None = None
    cls_out_b: np.ndarray = field(default_factory=lambda: _EMPTY)


def _norm(t: Tensors, name: str, n: int) -> Norm:
    return Norm(t.vec(f"{name}.weight", n), t.vec(f"{name}.bias", n))


def _opt_norm(t: Tensors, name: str, n: int) -> Norm | None:
    return _norm(t, name, n) if t.has(f"{name}.weight") else None


def _bias(t: Tensors, name: str, n: int) -> np.ndarray:
    return t.vec(name, n) if t.has(name) else _EMPTY


def _table(t: Tensors, name: str, cols: int) -> np.ndarray:
    """A small embedding table [rows, cols] as float32 (token types, learned positions)."""
    shape = t.shape(name)
    if shape is None or len(shape) != 2 or shape[0] != cols:
        raise UnsupportedModelError(f"{t.f.path}: tensor {name!r} must be [{cols}, rows], the file has {shape}")
    return t.vec(name, shape[0] * shape[1]).reshape(shape[1], cols)


def _attention(t: Tensors, cfg: EncoderConfig, p: str) -> tuple[list[QMatrix], list[np.ndarray]]:
    """Q, K, V as three matrices (a fused attn_qkv split into views) and their biases."""
    d, kv = cfg.d_model, cfg.kv_dim
    if t.has(p + "attn_qkv.weight"):
        mats = row_slices(t.mat(p + "attn_qkv.weight", d + 2 * kv, d), (d, kv, kv))
        if t.has(p + "attn_qkv.bias"):
            b = t.vec(p + "attn_qkv.bias", d + 2 * kv)
            return mats, [b[:d].copy(), b[d:d + kv].copy(), b[d + kv:].copy()]
    else:
        mats = [t.mat(p + f"attn_{x}.weight", n, d) for x, n in (("q", d), ("k", kv), ("v", kv))]
    return mats, [_bias(t, p + f"attn_{x}.bias", n) for x, n in (("q", d), ("k", kv), ("v", kv))]


def _ffn(t: Tensors, cfg: EncoderConfig, p: str) -> tuple[QMatrix, QMatrix | None, np.ndarray]:
    """(up, gate, up's bias): jina-bert-v2's fused [gate | up] up matrix (GeGLU) is split."""
    d, f = cfg.d_model, cfg.ffn_dim
    up_shape = t.shape(p + "ffn_up.weight")
    if cfg.ffn == "gelu_gated" and not t.has(p + "ffn_gate.weight") and up_shape is not None and up_shape[1] == 2 * f:
        # ggml_geglu: GELU of the first half times the second
        fused_gate, fused_up = row_slices(t.mat(p + "ffn_up.weight", 2 * f, d), (f, f))
        if t.has(p + "ffn_up.bias"):
            raise UnsupportedModelError(f"{t.f.path}: {p}ffn_up.bias on a fused GeGLU up matrix is not supported")
        return fused_up, fused_gate, _EMPTY
    up = t.mat(p + "ffn_up.weight", f, d)
    gated = cfg.ffn != "gelu"
    gate = t.mat(p + "ffn_gate.weight", f, d) if gated else None
    # nomic-bert's FFN takes no biases (llama.cpp builds it without them): a file's are ignored
    b_up = _bias(t, p + "ffn_up.bias", f) if cfg.ffn != "swiglu" else _EMPTY
    return up, gate, b_up


def load_encoder_weights(f: GGUFFile, cfg: EncoderConfig, backend: Backend) -> EncoderWeights:
    """All of an encoder's weights, its matrices prepared by the backend."""
    d = cfg.d_model
    t = Tensors(f, tuple(backend.matrix_types))
    emb = t.mat("token_embd.weight", cfg.vocab_size, d)
    type_row = _table(t, "token_types.weight", d)[0].copy() if t.has("token_types.weight") else np.zeros(d, np.float32)
    positions = _table(t, "position_embd.weight", d) if cfg.positions == "learned" else np.empty((0, d), np.float32)
    if cfg.positions == "learned" and positions.shape[0] < cfg.context_length:
        raise UnsupportedModelError(f"{f.path}: position_embd.weight has {positions.shape[0]} rows, fewer than the "
                                    f"context length {cfg.context_length}")
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        (wq, wk, wv), (bq, bk, bv) = _attention(t, cfg, p)
        up, gate, b_up = _ffn(t, cfg, p)
        layers.append(EncoderLayer(
            wq=wq, wk=wk, wv=wv, wo=t.mat(p + "attn_output.weight", d, d), w_up=up, w_gate=gate,
            w_down=t.mat(p + "ffn_down.weight", d, cfg.ffn_dim), bq=bq, bk=bk, bv=bv,
            bo=_bias(t, p + "attn_output.bias", d), b_up=b_up,
            b_down=_bias(t, p + "ffn_down.bias", d) if cfg.ffn != "swiglu" else _EMPTY,
            attn_out_norm=_norm(t, p + "attn_output_norm", d), out_norm=_norm(t, p + "layer_output_norm", d),
            q_norm=_opt_norm(t, p + "attn_q_norm", d) if cfg.arch == "jina-bert-v2" else None,
            k_norm=_opt_norm(t, p + "attn_k_norm", cfg.kv_dim) if cfg.arch == "jina-bert-v2" else None,
            norm_2=_opt_norm(t, p + "attn_norm_2", d) if cfg.arch == "jina-bert-v2" else None,
        ))
    w = EncoderWeights(emb, type_row, positions, _norm(t, "token_embd_norm", d), layers)
    cls_shape = t.shape("cls.weight")
    if cls_shape is not None:  # [D, D] before a classifier; jina's rerankers: [D, 1], the score itself
        rows = cls_shape[1] if len(cls_shape) == 2 else d
        w.cls, w.cls_b = t.mat("cls.weight", rows, d), _bias(t, "cls.bias", rows)
    if t.has("cls.output.weight"):
        w.cls_out, w.cls_out_b = t.mat("cls.output.weight", cfg.n_cls_out, d), _bias(t, "cls.output.bias", cfg.n_cls_out)
    # llama.cpp loads nomic-bert's FFN biases and never adds them: ignored here too
    t.refuse_unused(cfg.arch, ("blk.*.ffn_up.bias", "blk.*.ffn_down.bias") if cfg.ffn == "swiglu" else ())
    _prepare(f, w, backend)
    return w


def _prepare(f: GGUFFile, w: EncoderWeights, backend: Backend) -> None:
    """Every layer matrix (and the rank head's) in the backend's form, in place."""
    fields: list[tuple[EncoderLayer | EncoderWeights, str]] = [(lw, n) for lw in w.layers for n in lw.matrix_names()]
    fields += [(w, n) for n in ("cls", "cls_out") if getattr(w, n) is not None]
    prepared = backend.prepare_weights(f, [("layer", getattr(o, n)) for o, n in fields])
    for (o, n), m in zip(fields, prepared, strict=True):
        setattr(o, n, m)
