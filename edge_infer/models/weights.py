"""Model weights as the backend takes them: quantized matrices stay zero-copy views of the mmap'd
GGUF blocks (uint8 [rows, row_bytes] plus the GGML type id) until the backend prepares them;
norms and biases become float32."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.errors import EdgeInferError, UnsupportedModelError, UnsupportedTensorType
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.quants import dequantize
from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig

MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


@dataclass(slots=True)
class LayerWeights:
    attn_norm: np.ndarray
    wq: QMatrix
    wk: QMatrix
    wv: QMatrix
    wo: QMatrix
    ffn_norm: np.ndarray
    w_gate: QMatrix
    w_up: QMatrix
    w_down: QMatrix
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None


@dataclass(slots=True)
class ModelWeights:
    token_embd: QMatrix
    output_norm: np.ndarray
    output: QMatrix  # token_embd's data when the embeddings are tied
    layers: list[LayerWeights]


def decode_weight_bytes(w: ModelWeights) -> int:
    """Bytes of weights one decode step reads: every layer matrix and the output matrix in
    the form the backend computes with (the embedding contributes a row per token: ignored)."""
    layers = sum(getattr(lw, name).compute_nbytes for lw in w.layers for name in MATRIX_FIELDS)
    return layers + w.output.compute_nbytes


def qmatrix(f: GGUFFile, name: str, rows: int, cols: int, types: tuple[int, ...]) -> QMatrix:
    """The 2-D tensor `name` checked to be [rows, cols] (numpy order) in one of `types` (the
    backend's matrix types)."""
    t = _tensor(f, name)
    if len(t.shape) != 2 or t.shape[0] != cols or t.shape[1] != rows:
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has shape {t.shape}, expected ({cols}, {rows})")
    qtype = int(t.type)
    if qtype not in types:
        names = ", ".join(GGMLQuantizationType(q).name for q in types)
        raise UnsupportedTensorType(
            f"{f.path}: tensor {name!r} has type {t.type.name}, which edge-infer cannot compute with "
            f"(supported: {names})"
        )
    return QMatrix(name, t.data.reshape(rows, t.nbytes // rows), qtype, rows, cols)


def vector(f: GGUFFile, name: str, n: int) -> np.ndarray:
    """A 1-D tensor (norm weight, bias) as float32 [n] (a copy: small)."""
    t = _tensor(f, name)
    if t.n_elements != n:
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has {t.n_elements} elements, expected {n}")
    try:
        values = dequantize(t)
    except EdgeInferError as e:
        raise UnsupportedTensorType(f"{f.path}: tensor {name!r} has unsupported type {t.type.name}") from e
    return np.array(values.reshape(n), dtype=np.float32)


def _tensor(f: GGUFFile, name: str) -> TensorInfo:
    t = f.tensors.get(name)
    if t is None:
        raise UnsupportedModelError(f"{f.path}: missing tensor {name!r}")
    return t


def load_weights(f: GGUFFile, cfg: ModelConfig, backend: Backend) -> ModelWeights:
    """All weights of a llama/qwen2/gemma3-style model, prepared by the backend; nothing is
    copied but small vectors (and what the backend repacks)."""
    d, q_dim, kv_dim, ff = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    types = tuple(backend.matrix_types)

    def mat(name: str, rows: int, cols: int) -> QMatrix:
        return qmatrix(f, name, rows, cols, types)

    emb = mat("token_embd.weight", cfg.vocab_size, d)
    output = emb if "output.weight" not in f.tensors else mat("output.weight", cfg.vocab_size, d)
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        lw = LayerWeights(
            attn_norm=vector(f, p + "attn_norm.weight", d),
            wq=mat(p + "attn_q.weight", q_dim, d),
            wk=mat(p + "attn_k.weight", kv_dim, d),
            wv=mat(p + "attn_v.weight", kv_dim, d),
            wo=mat(p + "attn_output.weight", d, q_dim),
            ffn_norm=vector(f, p + "ffn_norm.weight", d),
            w_gate=mat(p + "ffn_gate.weight", ff, d),
            w_up=mat(p + "ffn_up.weight", ff, d),
            w_down=mat(p + "ffn_down.weight", d, ff),
        )
        if cfg.qkv_bias:
            lw.bq = vector(f, p + "attn_q.bias", q_dim)
            lw.bk = vector(f, p + "attn_k.bias", kv_dim)
            lw.bv = vector(f, p + "attn_v.bias", kv_dim)
        if cfg.qk_norm:
            lw.q_norm = vector(f, p + "attn_q_norm.weight", cfg.head_dim)
            lw.k_norm = vector(f, p + "attn_k_norm.weight", cfg.head_dim)
        if cfg.post_norms:
            lw.post_attn_norm = vector(f, p + "post_attention_norm.weight", d)
            lw.post_ffn_norm = vector(f, p + "post_ffw_norm.weight", d)
        layers.append(lw)
    # the backend's form of every matrix (the token embedding is read by rows: left as it is)
    roles = [("layer", getattr(lw, name)) for lw in layers for name in MATRIX_FIELDS] + [("output", output)]
    prepared = iter(backend.prepare_weights(f, roles))
    for lw in layers:
        for name in MATRIX_FIELDS:
            setattr(lw, name, next(prepared))
    return ModelWeights(emb, vector(f, "output_norm.weight", d), next(prepared), layers)
