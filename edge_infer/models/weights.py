"""Model weights as the backend takes them: quantized matrices stay zero-copy views of the mmap'd
GGUF blocks (uint8 [rows, row_bytes] plus the GGML type id) until the backend prepares them;
norms and biases become float32."""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatch

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.errors import EdgeInferError, UnsupportedModelError, UnsupportedTensorType
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.quants import dequantize
from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights_recurrent import DELTA_FIELDS, DeltaWeights, SsmWeights, load_recurrent

MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "in_proj", "out_proj", "w_gate", "w_up", "w_down")  # in/out_proj: recurrent blocks
EXPERT_FIELDS = ("router", "gate", "up", "down")


@dataclass(slots=True)
class ExpertWeights:
    """A mixture-of-experts FFN: the router [E, D] (ffn_gate_inp) and the experts' gate, up
    [E, Fe, D] and down [E, D, Fe] stacks (QMatrix with 3-D data); n_used experts per token.
    shared_gate f32 [D]: qwen2moe's gate of the shared expert (the layer's dense FFN); None for
    an ungated one (granitehybrid) or none; select_bias (lfm2moe's exp_probs_b) ranks the
    experts, not weighting them."""

    router: QMatrix
    gate: QMatrix
    up: QMatrix
    down: QMatrix
    n_used: int
    shared_gate: np.ndarray | None = None
    select_bias: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # f32 [E], or [0]: none
    router_bias: np.ndarray | None = None  # gpt-oss: f32 [E] added to the router's logits
    gate_bias: np.ndarray | None = None  # gpt-oss: f32 [E, Fe] per expert (up_bias too)
    up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None  # f32 [E, D]


@dataclass(slots=True)
class LayerWeights:
    """One block's weights: attention (wq..wo), a short convolution's in_proj [3D, D], conv f32
    [D, L] (each channel's L taps, oldest first) and out_proj [D, D], or a Mamba2 block's
    in_proj, out_proj and `ssm`; then its FFN."""

    attn_norm: np.ndarray | None  # None: no pre-norm (olmo2)
    wq: QMatrix | None  # None in a short-convolution layer
    wk: QMatrix | None
    wv: QMatrix | None
    wo: QMatrix | None
    ffn_norm: np.ndarray | None
    w_gate: QMatrix | None  # None in a mixture-of-experts layer without a shared expert
    w_up: QMatrix | None
    w_down: QMatrix | None
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None  # attn_output's bias (apertus)
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    sinks: np.ndarray | None = None  # gpt-oss: f32 [n_heads] attention-sink logits
    experts: ExpertWeights | None = None  # a mixture-of-experts FFN (the dense one, if any, is shared)
    in_proj: QMatrix | None = None
    conv: np.ndarray | None = None
    out_proj: QMatrix | None = None
    ssm: SsmWeights | None = None
    delta: DeltaWeights | None = None

    def matrices(self) -> list[tuple[str, QMatrix]]:
        """(field, matrix) of every matrix the layer has: dense ones, then its experts'."""
        out = [(name, m) for name in MATRIX_FIELDS if (m := getattr(self, name)) is not None]
        if self.experts is not None:
            out += [(f"experts.{name}", getattr(self.experts, name)) for name in EXPERT_FIELDS]
        if self.delta is not None:
            out += [(f"delta.{name}", getattr(self.delta, name)) for name in DELTA_FIELDS]
        return out

    def set_matrix(self, field: str, m: QMatrix) -> None:
        owner, _, name = field.rpartition(".")
        setattr(getattr(self, owner) if owner else self, name, m)


@dataclass(slots=True)
class ModelWeights:
    token_embd: QMatrix
    output_norm: np.ndarray
    output: QMatrix  # token_embd's data when the embeddings are tied
    layers: list[LayerWeights]


def decode_weight_bytes(w: ModelWeights) -> int:
    """Bytes of weights one decode step reads: every layer matrix and the output matrix in
    the form the backend computes with (the embedding contributes a row per token: ignored; of
    each expert stack, the n_used / E share a token reads)."""
    total = w.output.compute_nbytes
    for lw in w.layers:
        for _, m in lw.matrices():
            share = lw.experts.n_used / m.n_experts if m.n_experts and lw.experts else 1.0
            total += int(m.compute_nbytes * share)
    return total


def qmatrix(f: GGUFFile, name: str, rows: int, cols: int, types: tuple[int, ...]) -> QMatrix:
    """The 2-D tensor `name` checked to be [rows, cols] (numpy order) in one of `types` (the
    backend's matrix types)."""
    t = _tensor(f, name)
    if len(t.shape) != 2 or t.shape[0] != cols or t.shape[1] != rows:
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has shape {t.shape}, expected ({cols}, {rows})")
    data = qmatrix_data(f, name, t, types)
    return QMatrix(name, data.reshape(rows, t.nbytes // rows), int(t.type), rows, cols)


def expert_stack(f: GGUFFile, name: str, n_experts: int, rows: int, cols: int, types: tuple[int, ...]) -> QMatrix:
    """The 3-D tensor `name` checked to be [n_experts, rows, cols] (numpy order): E matrices."""
    t = _tensor(f, name)
    if tuple(t.shape) != (cols, rows, n_experts):
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has shape {t.shape}, expected ({cols}, {rows}, {n_experts})")
    m = qmatrix_data(f, name, t, types)
    return QMatrix(name, m.reshape(n_experts, rows, t.nbytes // (n_experts * rows)), int(t.type), rows, cols)


def qmatrix_data(f: GGUFFile, name: str, t: TensorInfo, types: tuple[int, ...]) -> np.ndarray:
    """The tensor's bytes, refused by name when the backend cannot compute with its type."""
    if int(t.type) not in types:
        names = ", ".join(GGMLQuantizationType(q).name for q in types)
        raise UnsupportedTensorType(
            f"{f.path}: tensor {name!r} has type {t.type.name}, which edge-infer cannot compute with "
            f"(supported: {names})"
        )
    return t.data


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


def row_slices(m: QMatrix, rows: tuple[int, ...]) -> list[QMatrix]:
    """A fused matrix split by output rows into zero-copy views (phi3's attn_qkv, ffn_up)."""
    out, at = [], 0
    for n in rows:
        out.append(QMatrix(m.name, m.data[at : at + n], m.qtype, n, m.cols))
        at += n
    return out


class _Tensors:
    """The file's tensors as load_weights takes them, remembering which it took."""

    def __init__(self, f: GGUFFile, types: tuple[int, ...]) -> None:
        self.f, self.types, self.used = f, types, set[str]()

    def mat(self, name: str, rows: int, cols: int) -> QMatrix:
        self.used.add(name)
        return qmatrix(self.f, name, rows, cols, self.types)

    def stack(self, name: str, n_experts: int, rows: int, cols: int) -> QMatrix:
        self.used.add(name)
        return expert_stack(self.f, name, n_experts, rows, cols, self.types)

    def vec(self, name: str, n: int) -> np.ndarray:
        self.used.add(name)
        return vector(self.f, name, n)

    def has(self, name: str) -> bool:
        return name in self.f.tensors

    def check_all_used(self, cfg: ModelConfig) -> None:
        """Every tensor is used or on the architecture's list of tensors it may ignore."""
        used = self.used | {name for name, factors in (("rope_freqs.weight", cfg.rope_freqs),
                                                       ("rope_factors_long.weight", cfg.rope_factors_long),
                                                       ("rope_factors_short.weight", cfg.rope_factors_short)) if factors}
        left = sorted(n for n in self.f.tensors if n not in used and not any(fnmatch(n, p) for p in cfg.ignored_tensors))
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise UnsupportedModelError(
                f"{self.f.path}: tensor{'s' if len(left) > 1 else ''} {', '.join(map(repr, left[:5]))}{more} "
                f"not used by edge-infer's {cfg.arch} model (a variant it does not support: supported architectures "
                f"and their tensors are listed in the README)"
            )


def load_weights(f: GGUFFile, cfg: ModelConfig, backend: Backend) -> ModelWeights:
    """All weights of a model, prepared by the backend; nothing is copied but small vectors (and
    what the backend repacks). Every tensor of the file must be used (or ignorable)."""
    d = cfg.d_model
    t = _Tensors(f, tuple(backend.matrix_types))
    emb = t.mat("token_embd.weight", cfg.vocab_size, d)
    output = emb if cfg.tied_embeddings else t.mat("output.weight", cfg.vocab_size, d)
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        lw = LayerWeights(attn_norm=t.vec(p + "attn_norm.weight", d) if cfg.pre_norms else None,
                          wq=None, wk=None, wv=None, wo=None, ffn_norm=None, w_gate=None, w_up=None, w_down=None)
        if cfg.has_attention(i):
            _attention(t, cfg, p, lw)
        if cfg.has_mixer(i) and cfg.is_recurrent(i):
            load_recurrent(t, cfg, i, lw)
        if cfg.has_ffn(i):
            _ffn(t, cfg, i, lw)
        if cfg.post_norms:
            lw.post_attn_norm = t.vec(p + "post_attention_norm.weight", d)
            lw.post_ffn_norm = t.vec(p + "post_ffw_norm.weight", d)
        layers.append(lw)
    output_norm = t.vec(cfg.output_norm_tensor, d)
    t.check_all_used(cfg)
    # the backend's form of every matrix (the token embedding is read by rows: left as it is)
    fields = [(lw, name, m) for lw in layers for name, m in lw.matrices()]
    prepared = backend.prepare_weights(f, [("layer", m) for _, _, m in fields] + [("output", output)])
    for (lw, name, _), m in zip(fields, prepared):
        lw.set_matrix(name, m)
    return ModelWeights(emb, output_norm, prepared[-1], layers)


def _attention(t: _Tensors, cfg: ModelConfig, p: str, lw: LayerWeights) -> None:
    """Layer p's attention projections, biases and QK norms."""
    d, q_dim, kv_dim, hd = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.head_dim
    if cfg.fused_qkv:
        lw.wq, lw.wk, lw.wv = row_slices(t.mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d), (q_dim, kv_dim, kv_dim))
    else:
        q_rows = 2 * q_dim if cfg.attn_output_gate else q_dim  # qwen35: [q | gate] per head
        lw.wq, lw.wk, lw.wv = (t.mat(p + "attn_q.weight", q_rows, d), t.mat(p + "attn_k.weight", kv_dim, d),
                               t.mat(p + "attn_v.weight", kv_dim, d))
    lw.wo = t.mat(p + "attn_output.weight", d, q_dim)
    if cfg.attn_out_bias and t.has(p + "attn_output.bias"):  # apertus: optional
        lw.bo = t.vec(p + "attn_output.bias", d)
    if cfg.qkv_bias or t.has(p + "attn_q.bias"):  # required (qwen2) or optional (llama)
        lw.bq, lw.bk, lw.bv = (t.vec(p + f"attn_{x}.bias", n) for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
    if cfg.attn_sinks:
        lw.sinks = t.vec(p + "attn_sinks.weight", cfg.n_heads)
    if cfg.qk_norm or cfg.qk_norm_full:
        lw.q_norm = t.vec(p + "attn_q_norm.weight", q_dim if cfg.qk_norm_full else hd)
        lw.k_norm = t.vec(p + "attn_k_norm.weight", kv_dim if cfg.qk_norm_full else hd)


def _ffn(t: _Tensors, cfg: ModelConfig, i: int, lw: LayerWeights) -> None:
    """Layer i's FFN: its pre-norm (none in nemotron_h's FFN-only layers, where attn_norm is
    it), then a dense SwiGLU / GeGLU (gate, up, down), an ungated one (relu2, xielu: up, down), or the
    mixture of experts with its shared expert, if any, as the dense matrices."""
    p, d, ff = f"blk.{i}.", cfg.d_model, cfg.ffn_dim
    if cfg.pre_norms and cfg.has_mixer(i):
        norm = p + cfg.ffn_norm_tensor + ".weight"  # falcon-h1's converter writes it without ".weight"
        lw.ffn_norm = t.vec(norm if t.has(norm) or not t.has(norm[:-7]) else norm[:-7], d)
    if cfg.is_moe(i):
        lw.experts = _experts(t, cfg, p)
        if cfg.shared_ffn_dim:
            fs = cfg.shared_ffn_dim
            lw.w_gate, lw.w_up = t.mat(p + "ffn_gate_shexp.weight", fs, d), t.mat(p + "ffn_up_shexp.weight", fs, d)
            lw.w_down = t.mat(p + "ffn_down_shexp.weight", d, fs)
        return
    if cfg.fused_gate_up:
        lw.w_gate, lw.w_up = row_slices(t.mat(p + "ffn_up.weight", 2 * ff, d), (ff, ff))
    elif cfg.activation not in ("relu2", "xielu"):
        lw.w_gate, lw.w_up = t.mat(p + "ffn_gate.weight", ff, d), t.mat(p + "ffn_up.weight", ff, d)
    else:
        lw.w_up = t.mat(p + "ffn_up.weight", ff, d)
    lw.w_down = t.mat(p + "ffn_down.weight", d, ff)


def _experts(t: _Tensors, cfg: ModelConfig, p: str) -> ExpertWeights:
    """Layer p's mixture-of-experts FFN (lfm2moe: with the selection bias exp_probs_b)."""
    d, e, fe = cfg.d_model, cfg.n_experts, cfg.expert_ffn_dim
    ew = ExpertWeights(
        router=t.mat(p + "ffn_gate_inp.weight", e, d),
        gate=t.stack(p + "ffn_gate_exps.weight", e, fe, d),
        up=t.stack(p + "ffn_up_exps.weight", e, fe, d),
        down=t.stack(p + "ffn_down_exps.weight", e, d, fe),
        n_used=cfg.n_experts_used,
        shared_gate=t.vec(p + "ffn_gate_inp_shexp.weight", d) if cfg.shared_ffn_dim and cfg.shared_expert_gated else None,
        select_bias=t.vec(p + "exp_probs_b.bias", e) if cfg.expert_select_bias else np.zeros(0, np.float32),
    )
    if cfg.expert_biases:  # gpt-oss
        ew.router_bias = t.vec(p + "ffn_gate_inp.bias", e)
        ew.gate_bias = t.vec(p + "ffn_gate_exps.bias", e * fe).reshape(e, fe)
        ew.up_bias = t.vec(p + "ffn_up_exps.bias", e * fe).reshape(e, fe)
        ew.down_bias = t.vec(p + "ffn_down_exps.bias", e * d).reshape(e, d)
    return ew
