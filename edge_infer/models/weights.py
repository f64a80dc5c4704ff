"""Model weights as the kernels take them: quantized matrices stay zero-copy views of the mmap'd
GGUF blocks (uint8 [rows, row_bytes] plus the GGML type id); norms and biases become float32."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edge_infer.errors import UnsupportedModelError, UnsupportedTensorType
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.kernels_cpu.dequant import BLOCK_SHAPE, KERNEL_TYPES, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, decode_row
from edge_infer.kernels_cpu.repack_i8 import I8Weights, repack
from edge_infer.models.config import ModelConfig


@dataclass(frozen=True, slots=True)
class QMatrix:
    """A [rows, cols] weight in GGUF block layout: data is uint8 [rows, row_bytes]. i8: the
    same weights repacked for the int8 kernel (kernels_cpu.matmul_i8), which then computes
    every product with this matrix; data is kept only for row lookups (tied embeddings)."""

    name: str
    data: np.ndarray
    qtype: int
    rows: int
    cols: int
    i8: I8Weights | None = None


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


def qmatrix(f: GGUFFile, name: str, rows: int, cols: int) -> QMatrix:
    """The 2-D tensor `name` checked to be [rows, cols] (numpy order) in a kernel type."""
    t = _tensor(f, name)
    if len(t.shape) != 2 or t.shape[0] != cols or t.shape[1] != rows:
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has shape {t.shape}, expected ({cols}, {rows})")
    qtype = int(t.type)
    if qtype not in KERNEL_TYPES:
        raise UnsupportedTensorType(
            f"{f.path}: tensor {name!r} has type {t.type.name}, which edge-infer cannot compute with "
            f"(supported: {', '.join(_type_names())})"
        )
    return QMatrix(name, t.data.reshape(rows, t.nbytes // rows), qtype, rows, cols)


def vector(f: GGUFFile, name: str, n: int) -> np.ndarray:
    """A 1-D tensor (norm weight, bias) as float32 [n]."""
    t = _tensor(f, name)
    if t.n_elements != n:
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has {t.n_elements} elements, expected {n}")
    qtype = int(t.type)
    if qtype not in KERNEL_TYPES or n % BLOCK_SHAPE[qtype][0]:
        raise UnsupportedTensorType(f"{f.path}: tensor {name!r} has unsupported type {t.type.name}")
    out = np.empty(n, np.float32)
    decode_row(qtype, t.data, out)
    return out


def _tensor(f: GGUFFile, name: str) -> TensorInfo:
    t = f.tensors.get(name)
    if t is None:
        raise UnsupportedModelError(f"{f.path}: missing tensor {name!r}")
    return t


def _type_names() -> list[str]:
    from gguf import GGMLQuantizationType

    return [GGMLQuantizationType(t).name for t in KERNEL_TYPES]


def load_weights(f: GGUFFile, cfg: ModelConfig) -> ModelWeights:
    """All weights of a llama/qwen2/gemma3-style model; nothing is copied but small vectors."""
    d, q_dim, kv_dim, ff = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim
    emb = qmatrix(f, "token_embd.weight", cfg.vocab_size, d)
    output = emb if "output.weight" not in f.tensors else qmatrix(f, "output.weight", cfg.vocab_size, d)
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        lw = LayerWeights(
            attn_norm=vector(f, p + "attn_norm.weight", d),
            wq=qmatrix(f, p + "attn_q.weight", q_dim, d),
            wk=qmatrix(f, p + "attn_k.weight", kv_dim, d),
            wv=qmatrix(f, p + "attn_v.weight", kv_dim, d),
            wo=qmatrix(f, p + "attn_output.weight", d, q_dim),
            ffn_norm=vector(f, p + "ffn_norm.weight", d),
            w_gate=qmatrix(f, p + "ffn_gate.weight", ff, d),
            w_up=qmatrix(f, p + "ffn_up.weight", ff, d),
            w_down=qmatrix(f, p + "ffn_down.weight", d, ff),
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
    # Int8 kernel (activations quantized per 32-block, integer dot products): Q4_0/Q4_1/Q5_0/
    # Q5_1 layer matrices and a Q8_0 output matrix, the types whose codes it takes as they are.
    # Other layer types keep the float path (decoded blocks, float32 products).
    for lw in layers:
        for field in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            setattr(lw, field, with_i8(f, getattr(lw, field), (Q4_0, Q4_1, Q5_0, Q5_1)))
    return ModelWeights(emb, vector(f, "output_norm.weight", d), with_i8(f, output, (Q8_0,)), layers)


def with_i8(f: GGUFFile, w: QMatrix, types: tuple[int, ...]) -> QMatrix:
    """w repacked for the int8 kernel when its type is in `types`; the repacked copy replaces
    the tensor's mmap'd pages (dropped here; a row lookup faults its page back in)."""
    if w.qtype not in types or w.cols % 32:
        return w
    packed = replace(w, i8=repack(w.data, w.qtype, w.rows, w.cols))
    f.drop_pages(f.tensors[w.name])
    return packed
