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
from edge_infer.models.weights_altup import AltUpLayer, load_altup_layer, load_altup_projections
from edge_infer.models.weights_experts import EXPERT_FIELDS, ExpertWeights, load_experts
from edge_infer.models.weights_per_layer import load_per_layer_input
from edge_infer.models.weights_recurrent import DELTA_FIELDS, DeltaWeights, SsmWeights, load_recurrent

MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "in_proj", "out_proj", "w_gate", "w_up", "w_down",  # in/out_proj: recurrent blocks
                 "ple_in_proj", "ple_gate", "ple_proj",  # gemma4's per-layer embedding input
                 "alt_router", "laurel_l", "laurel_r")  # gemma3n's AltUp router and LAuReL


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
    # gemma4: the layer's rows of per_layer_model_proj [P, D], inp_gate [P, D], proj [D, P],
    # post_norm [D]; layer_output_scale [1]
    ple_in_proj: QMatrix | None = None
    ple_gate: QMatrix | None = None
    ple_proj: QMatrix | None = None
    ple_norm: np.ndarray | None = None
    out_scale: np.ndarray | None = None
    # gemma3n: AltUp's router [A, D] and vectors, LAuReL's laurel_l [R, D] and laurel_r [D, R]
    alt_router: QMatrix | None = None
    altup: AltUpLayer | None = None
    laurel_l: QMatrix | None = None
    laurel_r: QMatrix | None = None

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
    # gemma4: per_layer_token_embd viewed as one [P] row per (token, layer), row t * L + l;
    # per_layer_proj_norm f32 [P]
    ple_embd: QMatrix | None = None
    ple_proj_norm: np.ndarray | None = None
    # gemma3n: altup_proj and altup_unembd_proj, A - 1 [D, D] matrices each
    alt_proj: list[QMatrix] = field(default_factory=list)
    alt_unembed: list[QMatrix] = field(default_factory=list)


def decode_weight_bytes(w: ModelWeights) -> int:
    """Bytes of weights one decode step reads: every layer matrix and the output matrix in
    the form the backend computes with (the embedding contributes a row per token: ignored; of
    each expert stack, the n_used / E share a token reads)."""
    total = w.output.compute_nbytes + sum(m.compute_nbytes for m in w.alt_proj + w.alt_unembed)
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


def float_matrix(values: np.ndarray, name: str) -> QMatrix:
    """A float32 [rows, cols] array as an F32 QMatrix (its bytes are the GGUF row layout)."""
    a = np.ascontiguousarray(values, np.float32)
    return QMatrix(name, a.view(np.uint8).reshape(a.shape[0], a.shape[1] * 4), 0, a.shape[0], a.shape[1])


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


class Tensors:
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

    def shape(self, name: str) -> tuple[int, ...] | None:
        """The tensor's GGUF shape (innermost first), None when the file lacks it."""
        info = self.f.tensors.get(name)
        return None if info is None else tuple(int(n) for n in info.shape)

    def check_all_used(self, cfg: ModelConfig) -> None:
        """Every tensor is used or on the architecture's list of tensors it may ignore."""
        self.used |= {name for name, factors in (("rope_freqs.weight", cfg.rope_freqs),
                                                 ("rope_factors_long.weight", cfg.rope_factors_long),
                                                 ("rope_factors_short.weight", cfg.rope_factors_short)) if factors}
        self.refuse_unused(cfg.arch, cfg.ignored_tensors)

    def refuse_unused(self, arch: str, ignored: tuple[str, ...] = ()) -> None:
        """UnsupportedModelError naming the tensors neither used nor matching an `ignored` pattern."""
        left = sorted(n for n in self.f.tensors if n not in self.used and not any(fnmatch(n, p) for p in ignored))
        if left:
            more = f" and {len(left) - 5} more" if len(left) > 5 else ""
            raise UnsupportedModelError(
                f"{self.f.path}: tensor{'s' if len(left) > 1 else ''} {', '.join(map(repr, left[:5]))}{more} "
                f"not used by edge-infer's {arch} model (a variant it does not support: supported architectures "
                f"and their tensors are listed in the README)"
            )


def load_weights(f: GGUFFile, cfg: ModelConfig, backend: Backend) -> ModelWeights:
    """All weights of a model, prepared by the backend; nothing is copied but small vectors (and
    what the backend repacks). Every tensor of the file must be used (or ignorable)."""
    d = cfg.d_model
    t = Tensors(f, tuple(backend.matrix_types))
    emb = t.mat("token_embd.weight", cfg.vocab_size, d)
    output = emb if cfg.tied_embeddings else t.mat("output.weight", cfg.vocab_size, d)
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        lw = LayerWeights(attn_norm=t.vec(p + "attn_norm.weight", d) if cfg.pre_norms else None,
                          wq=None, wk=None, wv=None, wo=None, ffn_norm=None, w_gate=None, w_up=None, w_down=None)
        if cfg.has_attention(i):
            _attention(t, cfg, i, lw)
        if cfg.has_mixer(i) and cfg.is_recurrent(i):
            load_recurrent(t, cfg, i, lw)
        if cfg.has_ffn(i):
            _ffn(t, cfg, i, lw)
        if cfg.post_norms:
            lw.post_attn_norm = t.vec(p + "post_attention_norm.weight", d)
            lw.post_ffn_norm = t.vec(p + "post_ffw_norm.weight", d)
        if cfg.altup_streams:
            lw.alt_router, lw.laurel_l, lw.laurel_r, lw.altup = load_altup_layer(t, cfg, i)
        if cfg.layer_output_scale and t.has(p + "layer_output_scale.weight"):
            lw.out_scale = t.vec(p + "layer_output_scale.weight", 1)
        layers.append(lw)
    ple_embd, ple_proj_norm = load_per_layer_input(t, cfg, layers) if cfg.per_layer_input else (None, None)
    alt_proj, alt_unembed = load_altup_projections(t, cfg) if cfg.altup_streams else ([], [])
    output_norm = t.vec(cfg.output_norm_tensor, d)
    t.check_all_used(cfg)
    # the backend's form of every matrix (the token embedding is read by rows: left as it is)
    fields = [(lw, name, m) for lw in layers for name, m in lw.matrices()]
    extra = alt_proj + alt_unembed
    prepared = backend.prepare_weights(f, [("layer", m) for _, _, m in fields] + [("layer", m) for m in extra]
                                       + [("output", output)])
    for (lw, name, _), m in zip(fields, prepared):
        lw.set_matrix(name, m)
    alt = prepared[len(fields) : len(fields) + len(extra)]
    k = len(alt_proj)
    return ModelWeights(emb, output_norm, prepared[-1], layers, ple_embd, ple_proj_norm, alt[:k], alt[k:])


def _attention(t: Tensors, cfg: ModelConfig, i: int, lw: LayerWeights) -> None:
    """Layer i's attention projections, biases and QK norms (a KV-shared layer's Q only:
    its attn_k, attn_v and K norm, if the file has them, go unused, as in llama.cpp)."""
    p, d, hd = f"blk.{i}.", cfg.d_model, cfg.layer_head_dim(i)
    q_dim, kv_dim = cfg.n_heads * hd, cfg.layer_kv_heads(i) * hd
    shared = cfg.kv_source(i) != i
    if cfg.fused_qkv:
        lw.wq, lw.wk, lw.wv = row_slices(t.mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d), (q_dim, kv_dim, kv_dim))
    else:
        q_rows = 2 * q_dim if cfg.attn_output_gate else q_dim  # qwen35: [q | gate] per head
        lw.wq = t.mat(p + "attn_q.weight", q_rows, d)
        if shared:
            t.used.update(p + f"attn_{x}.weight" for x in ("k", "v", "k_norm"))
        else:
            lw.wk = t.mat(p + "attn_k.weight", kv_dim, d)
            # gemma4: a layer without attn_v (wv None) attends with V = K's projection before its norm
            if not (cfg.k_eq_v and not t.has(p + "attn_v.weight")):
                lw.wv = t.mat(p + "attn_v.weight", kv_dim, d)
    lw.wo = t.mat(p + "attn_output.weight", d, q_dim)
    if cfg.attn_out_bias and t.has(p + "attn_output.bias"):  # apertus: optional
        lw.bo = t.vec(p + "attn_output.bias", d)
    if cfg.qkv_bias or t.has(p + "attn_q.bias"):  # required (qwen2) or optional (llama)
        lw.bq, lw.bk, lw.bv = (t.vec(p + f"attn_{x}.bias", n) for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
    if cfg.attn_sinks:
        lw.sinks = t.vec(p + "attn_sinks.weight", cfg.n_heads)
    if cfg.qk_norm or cfg.qk_norm_full:
        lw.q_norm = t.vec(p + "attn_q_norm.weight", q_dim if cfg.qk_norm_full else hd)
        if not shared:
            lw.k_norm = t.vec(p + "attn_k_norm.weight", kv_dim if cfg.qk_norm_full else hd)


def _ffn(t: Tensors, cfg: ModelConfig, i: int, lw: LayerWeights) -> None:
    """Layer i's FFN: its pre-norm (none in nemotron_h's FFN-only layers, where attn_norm is
    it), then a dense SwiGLU / GeGLU (gate, up, down), an ungated one (relu2, xielu: up, down), or the
    mixture of experts with its shared expert, if any, as the dense matrices."""
    p, d, ff = f"blk.{i}.", cfg.d_model, cfg.layer_ffn_dim(i)
    if cfg.pre_norms and cfg.has_mixer(i):
        norm = p + cfg.ffn_norm_tensor + ".weight"  # falcon-h1's converter writes it without ".weight"
        lw.ffn_norm = t.vec(norm if t.has(norm) or not t.has(norm[:-7]) else norm[:-7], d)
    if cfg.is_moe(i):
        lw.experts = load_experts(t, cfg, p)
        if cfg.moe_beside_dense:  # gemma4: the layer's dense MLP too
            lw.w_gate, lw.w_up = t.mat(p + "ffn_gate.weight", ff, d), t.mat(p + "ffn_up.weight", ff, d)
            lw.w_down = t.mat(p + "ffn_down.weight", d, ff)
        elif cfg.shared_ffn_dim:
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
