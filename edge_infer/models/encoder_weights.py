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
    attn_out_norm: Norm | None  # post-norm blocks' norms (None in a pre-norm block)
    out_norm: Norm | None
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    norm_2: Norm | None = None
    # pre-norm blocks (modern-bert: LayerNorms without bias, zeros here; gemma-embedding: RMSNorm
    # weights, with post-norms and per-head Q/K RMSNorm weights [head_dim])
    attn_norm: Norm | None = None
    ffn_norm: Norm | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    q_head_norm: np.ndarray | None = None
    k_head_norm: np.ndarray | None = None

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
    input_norm: Norm | None  # None: gemma-embedding (its embeddings are scaled, not normed)
    layers: list[EncoderLayer]
    cls: QMatrix | None = None
    cls_b: np.ndarray = field(default_factory=lambda: _EMPTY)
    cls_out: QMatrix | None = None
    cls_out_b: np.ndarray = field(default_factory=lambda: _EMPTY)
    cls_norm: Norm | None = None  # modern-bert's rank head: a LayerNorm after its GELU
    output_norm: Norm | None = None  # pre-norm blocks' final norm
    # gemma-embedding's sentence-transformers projections after pooling: dense_2 [D2, D] (+ b), dense_3 [D, D2]
    dense_2: QMatrix | None = None
    dense_2_b: np.ndarray = field(default_factory=lambda: _EMPTY)
    dense_3: QMatrix | None = None


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
    d, q, kv = cfg.d_model, cfg.q_dim, cfg.kv_dim
    if t.has(p + "attn_qkv.weight"):
        mats = row_slices(t.mat(p + "attn_qkv.weight", q + 2 * kv, d), (q, kv, kv))
        if t.has(p + "attn_qkv.bias"):
            b = t.vec(p + "attn_qkv.bias", q + 2 * kv)
            return mats, [b[:q].copy(), b[q:q + kv].copy(), b[q + kv:].copy()]
    else:
        mats = [t.mat(p + f"attn_{x}.weight", n, d) for x, n in (("q", q), ("k", kv), ("v", kv))]
    return mats, [_bias(t, p + f"attn_{x}.bias", n) for x, n in (("q", q), ("k", kv), ("v", kv))]


def _ffn(t: Tensors, cfg: EncoderConfig, p: str) -> tuple[QMatrix, QMatrix | None, np.ndarray]:
    """(up, gate, up's bias): a fused [gate | up] up matrix (jina-bert-v2's GeGLU, modern-bert's)
    is split."""
    d, f = cfg.d_model, cfg.ffn_dim
    up_shape = t.shape(p + "ffn_up.weight")
    fused = up_shape is not None and up_shape[1] == 2 * f and not t.has(p + "ffn_gate.weight")
    if cfg.ffn in ("gelu_gated", "swiglu", "reglu") and fused:
        # ggml_geglu / ggml_swiglu: the activation of the first half times the second
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


def _weight_norm(t: Tensors, cfg: EncoderConfig, name: str, n: int) -> Norm:
    """A pre-norm block's norm: its weight, and a zero bias for a LayerNorm (none in the file)."""
    return Norm(t.vec(f"{name}.weight", n), np.zeros(n if cfg.norm == "layer" else 0, np.float32))


def _pre_norm_layer(t: Tensors, cfg: EncoderConfig, i: int) -> EncoderLayer:
    """modern-bert's or gemma-embedding's block i (layer 0 of modern-bert has no attn_norm)."""
    p, d, f = f"blk.{i}.", cfg.d_model, cfg.ffn_dim
    (wq, wk, wv), (bq, bk, bv) = _attention(t, cfg, p)
    up, gate, b_up = _ffn(t, cfg, p)
    gemma = cfg.arch == "gemma-embedding"
    lw = EncoderLayer(
        wq=wq, wk=wk, wv=wv, wo=t.mat(p + "attn_output.weight", d, cfg.q_dim), w_up=up, w_gate=gate,
        w_down=t.mat(p + "ffn_down.weight", d, f), bq=bq, bk=bk, bv=bv, bo=_EMPTY, b_up=b_up, b_down=_EMPTY,
        attn_out_norm=None, out_norm=None,
        attn_norm=_weight_norm(t, cfg, p + "attn_norm", d) if gemma or i > 0 or t.has(p + "attn_norm.weight") else None,
        ffn_norm=_weight_norm(t, cfg, p + "ffn_norm", d),
    )
    if gemma:
        lw.post_attn_norm, lw.post_ffn_norm = t.vec(p + "post_attention_norm.weight", d), t.vec(p + "post_ffw_norm.weight", d)
        lw.q_head_norm = t.vec(p + "attn_q_norm.weight", cfg.head_dim)
        lw.k_head_norm = t.vec(p + "attn_k_norm.weight", cfg.head_dim)
    return lw


def load_encoder_weights(f: GGUFFile, cfg: EncoderConfig, backend: Backend) -> EncoderWeights:
    """All of an encoder's weights, its matrices prepared by the backend."""
    d = cfg.d_model
    t = Tensors(f, tuple(backend.matrix_types))
    emb = t.mat("token_embd.weight", cfg.vocab_size, d)
    if cfg.block == "pre_norm":
        return _load_pre_norm(f, t, cfg, emb, backend)
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


def _load_pre_norm(f: GGUFFile, t: Tensors, cfg: EncoderConfig, emb: QMatrix, backend: Backend) -> EncoderWeights:
    d = cfg.d_model
    gemma = cfg.arch == "gemma-embedding"
    w = EncoderWeights(emb, np.zeros(d, np.float32), np.empty((0, d), np.float32),
                       None if gemma else _weight_norm(t, cfg, "token_embd_norm", d),
                       [_pre_norm_layer(t, cfg, i) for i in range(cfg.n_layers)],
                       output_norm=_weight_norm(t, cfg, "output_norm", d))
    if t.has("cls.weight"):
        w.cls = t.mat("cls.weight", d, d)
        w.cls_norm = _weight_norm(t, cfg, "cls.norm", d) if t.has("cls.norm.weight") else None
    if t.has("cls.output.weight"):
        w.cls_out, w.cls_out_b = t.mat("cls.output.weight", cfg.n_cls_out, d), _bias(t, "cls.output.bias", cfg.n_cls_out)
    d2 = t.shape("dense_2.weight")
    if d2 is not None:
        w.dense_2 = t.mat("dense_2.weight", d2[1], d)
        w.dense_2_b = _bias(t, "dense_2.bias", d2[1])
    d3 = t.shape("dense_3.weight")
    if d3 is not None:
        w.dense_3 = t.mat("dense_3.weight", d, d3[0])
    # gemma-embedding's tied output matrix is llama.cpp's for generation: unused by embeddings
    t.refuse_unused(cfg.arch, ("output.weight",) if gemma else ())
    _prepare(f, w, backend)
    return w


def _prepare(f: GGUFFile, w: EncoderWeights, backend: Backend) -> None:
    """Every layer matrix (and the rank head's) in the backend's form, in place."""
    fields: list[tuple[EncoderLayer | EncoderWeights, str]] = [(lw, n) for lw in w.layers for n in lw.matrix_names()]
    fields += [(w, n) for n in ("cls", "cls_out", "dense_2", "dense_3") if getattr(w, n) is not None]
    prepared = backend.prepare_weights(f, [("layer", getattr(o, n)) for o, n in fields])
    for (o, n), m in zip(fields, prepared, strict=True):
        setattr(o, n, m)
