"""Model weights as the backend takes them: quantized matrices stay zero-copy views of the mmap'd
GGUF blocks (uint8 [rows, row_bytes] plus the GGML type id) until the backend prepares them;
norms and biases become float32."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.errors import EdgeInferError, UnsupportedModelError, UnsupportedTensorType
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.quants import dequantize
from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig

MATRIX_FIELDS = ("wq", "wk", "wv", "wo", "in_proj", "out_proj", "w_gate", "w_up", "w_down")  # in/out_proj: recurrent blocks
EXPERT_FIELDS = ("router", "gate", "up", "down")


@dataclass(slots=True)
class ExpertWeights:
    """A mixture-of-experts FFN: the router [E, D] (ffn_gate_inp) and the experts' gate, up
    [E, Fe, D] and down [E, D, Fe] stacks (QMatrix with 3-D data); n_used experts per token.
    shared_gate f32 [D]: qwen2moe's gate of the shared expert (the layer's dense FFN); None for
    an ungated one (granitehybrid) or none."""

    router: QMatrix
    gate: QMatrix
    up: QMatrix
    down: QMatrix
    n_used: int
    shared_gate: np.ndarray | None = None


@dataclass(slots=True)
class SsmWeights:
    """A Mamba2 block's vectors (its in_proj and out_proj are the layer's): conv f32 [C, L] the
    convolution's taps over x, B, C (C = ssm_conv_dim) and conv_bias [C] (zeros when the file
    has none); per head dt_bias, a (-exp(A_log), as the converter stores it) and d; norm
    [ssm_inner] the grouped RMSNorm's weight."""

    conv: np.ndarray
    conv_bias: np.ndarray
    dt_bias: np.ndarray
    a: np.ndarray
    d: np.ndarray
    norm: np.ndarray


@dataclass(slots=True)
class DeltaWeights:
    """A Gated DeltaNet block's own weights (its qkv projection and ssm_out are the layer's
    in_proj and out_proj): z [V, D] the output gate's projection (attn_gate), beta and alpha
    [H, D]; conv f32 [C, L] the convolution's taps over q, k, v (conv_bias: zeros, it has none);
    per head dt_bias and a (-exp(A_log)); norm [S] the per-head RMSNorm's weight."""

    z: QMatrix
    beta: QMatrix
    alpha: QMatrix
    conv: np.ndarray
    conv_bias: np.ndarray
    dt_bias: np.ndarray
    a: np.ndarray
    norm: np.ndarray


DELTA_FIELDS = ("z", "beta", "alpha")


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
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
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
    d, q_dim, kv_dim, ff, hd = cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim, cfg.head_dim
    t = _Tensors(f, tuple(backend.matrix_types))
    emb = t.mat("token_embd.weight", cfg.vocab_size, d)
    output = emb if cfg.tied_embeddings else t.mat("output.weight", cfg.vocab_size, d)
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        wq = wk = wv = wo = None
        if cfg.is_recurrent(i):
            pass  # a recurrent block instead of attention (below)
        elif cfg.fused_qkv:
            wq, wk, wv = row_slices(t.mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d), (q_dim, kv_dim, kv_dim))
        else:
            q_rows = 2 * q_dim if cfg.attn_output_gate else q_dim  # qwen35: [q | gate] per head
            wq, wk, wv = (t.mat(p + "attn_q.weight", q_rows, d), t.mat(p + "attn_k.weight", kv_dim, d),
                          t.mat(p + "attn_v.weight", kv_dim, d))
        if not cfg.is_recurrent(i):
            wo = t.mat(p + "attn_output.weight", d, q_dim)
        w_gate = w_up = w_down = None
        if cfg.fused_gate_up:
            w_gate, w_up = row_slices(t.mat(p + "ffn_up.weight", 2 * ff, d), (ff, ff))
        elif cfg.n_experts:
            if cfg.shared_ffn_dim:
                fs = cfg.shared_ffn_dim
                w_gate, w_up = t.mat(p + "ffn_gate_shexp.weight", fs, d), t.mat(p + "ffn_up_shexp.weight", fs, d)
                w_down = t.mat(p + "ffn_down_shexp.weight", d, fs)
        else:
            w_gate, w_up = t.mat(p + "ffn_gate.weight", ff, d), t.mat(p + "ffn_up.weight", ff, d)
        lw = LayerWeights(
            attn_norm=t.vec(p + "attn_norm.weight", d) if cfg.pre_norms else None,
            wq=wq, wk=wk, wv=wv,
            wo=wo,
            ffn_norm=t.vec(p + cfg.ffn_norm_tensor + ".weight", d) if cfg.pre_norms else None,
            w_gate=w_gate, w_up=w_up,
            w_down=w_down if cfg.n_experts else t.mat(p + "ffn_down.weight", d, ff),
            experts=_experts(t, cfg, p),
        )
        if cfg.is_conv(i):
            lw.in_proj = t.mat(p + "shortconv.in_proj.weight", 3 * d, d)
            lw.conv = t.vec(p + "shortconv.conv.weight", d * cfg.conv_kernel).reshape(d, cfg.conv_kernel)
            lw.out_proj = t.mat(p + "shortconv.out_proj.weight", d, d)
        elif cfg.is_ssm(i):
            _mamba2(t, cfg, p, lw)
        elif cfg.is_delta(i):
            _gated_delta(t, cfg, p, lw)
        elif cfg.qkv_bias or p + "attn_q.bias" in f.tensors:  # required (qwen2) or optional (llama)
            lw.bq, lw.bk, lw.bv = (t.vec(p + f"attn_{x}.bias", n) for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
        if (cfg.qk_norm or cfg.qk_norm_full) and not cfg.is_recurrent(i):
            lw.q_norm = t.vec(p + "attn_q_norm.weight", q_dim if cfg.qk_norm_full else hd)
            lw.k_norm = t.vec(p + "attn_k_norm.weight", kv_dim if cfg.qk_norm_full else hd)
        if cfg.post_norms:
            lw.post_attn_norm = t.vec(p + "post_attention_norm.weight", d)
            lw.post_ffn_norm = t.vec(p + "post_ffw_norm.weight", d)
        layers.append(lw)
    output_norm = t.vec(cfg.output_norm_tensor, d)
    t.check_all_used(cfg)
    # the backend's form of every matrix (the token embedding is read by rows: left as it is)
    fields = [(lw, field, m) for lw in layers for field, m in lw.matrices()]
    prepared = backend.prepare_weights(f, [("layer", m) for _, _, m in fields] + [("output", output)])
    for (lw, field, _), m in zip(fields, prepared):
        lw.set_matrix(field, m)
    return ModelWeights(emb, output_norm, prepared[-1], layers)


def _mamba2(t: _Tensors, cfg: ModelConfig, p: str, lw: LayerWeights) -> None:
    """Layer p's Mamba2 block (llama.cpp's tensor names and shapes)."""
    d, e, c, h, k = cfg.d_model, cfg.ssm_inner, cfg.ssm_conv_dim, cfg.ssm_heads, cfg.ssm_conv_kernel
    lw.in_proj = t.mat(p + "ssm_in.weight", 2 * e + 2 * cfg.ssm_groups * cfg.ssm_state + h, d)
    lw.out_proj = t.mat(p + "ssm_out.weight", d, e)
    bias = p + "ssm_conv1d.bias"
    lw.ssm = SsmWeights(
        conv=t.vec(p + "ssm_conv1d.weight", c * k).reshape(c, k),
        conv_bias=t.vec(bias, c) if bias in t.f.tensors else np.zeros(c, np.float32),
        dt_bias=t.vec(p + "ssm_dt.bias", h), a=t.vec(p + "ssm_a", h), d=t.vec(p + "ssm_d", h),
        norm=t.vec(p + "ssm_norm.weight", e),
    )


def _gated_delta(t: _Tensors, cfg: ModelConfig, p: str, lw: LayerWeights) -> None:
    """Layer p's Gated DeltaNet block (llama.cpp's qwen35 tensor names and shapes)."""
    d, v, c, h, k = cfg.d_model, cfg.ssm_inner, cfg.ssm_conv_dim, cfg.ssm_heads, cfg.ssm_conv_kernel
    lw.in_proj = t.mat(p + "attn_qkv.weight", c, d)
    lw.out_proj = t.mat(p + "ssm_out.weight", d, v)
    lw.delta = DeltaWeights(
        z=t.mat(p + "attn_gate.weight", v, d), beta=t.mat(p + "ssm_beta.weight", h, d),
        alpha=t.mat(p + "ssm_alpha.weight", h, d), conv=t.vec(p + "ssm_conv1d.weight", c * k).reshape(c, k),
        conv_bias=np.zeros(c, np.float32),
        dt_bias=t.vec(p + "ssm_dt.bias", h), a=t.vec(p + "ssm_a", h), norm=t.vec(p + "ssm_norm.weight", cfg.ssm_state),
    )


def _experts(t: _Tensors, cfg: ModelConfig, p: str) -> ExpertWeights | None:
    """Layer p's mixture-of-experts FFN, or None in a dense model."""
    if not cfg.n_experts:
        return None
    d, e, fe = cfg.d_model, cfg.n_experts, cfg.expert_ffn_dim
    return ExpertWeights(
        router=t.mat(p + "ffn_gate_inp.weight", e, d),
        gate=t.stack(p + "ffn_gate_exps.weight", e, fe, d),
        up=t.stack(p + "ffn_up_exps.weight", e, fe, d),
        down=t.stack(p + "ffn_down_exps.weight", e, d, fe),
        n_used=cfg.n_experts_used,
        shared_gate=t.vec(p + "ffn_gate_inp_shexp.weight", d) if cfg.shared_ffn_dim and cfg.shared_expert_gated else None,
    )
