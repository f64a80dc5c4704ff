"""A vision tower's weights in llama.cpp's mmproj tensor names (clip.cpp's load_tensors):
matrices prepared by the backend, norms, biases and position embeddings as float32. Every
tensor of the file is used or refused by name."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.quants import dequantize
from edge_infer.models.backend import Backend
from edge_infer.models.encoder_weights import Norm
from edge_infer.models.vision_config import QWEN25VL, VisionConfig
from edge_infer.models.weights import Tensors, float_matrix

_EMPTY = np.empty(0, np.float32)  # an absent bias: nothing added


@dataclass(slots=True)
class VisionLayer:
    """One pre-norm ViT block: LayerNorms ln1 / ln2, attention and a GELU MLP, all with biases."""

    ln1: Norm
    ln2: Norm
    wq: QMatrix
    wk: QMatrix
    wv: QMatrix
    wo: QMatrix
    w_up: QMatrix
    w_down: QMatrix
    bq: np.ndarray
    bk: np.ndarray
    bv: np.ndarray
    bo: np.ndarray
    b_up: np.ndarray
    b_down: np.ndarray
    w_gate: QMatrix | None = None  # pixtral's and qwen2.5vl's SwiGLU
    b_gate: np.ndarray = field(default_factory=lambda: _EMPTY)  # qwen2.5vl's


@dataclass(slots=True)
class VisionWeights:
    """patch: the patch embedding as a [d_model, 3 * p * p] matrix over a patch's (channel, row,
    column) values; positions f32 [n_patches, d_model]; head: the projector's tensors (matrices
    as QMatrix, the rest float32)."""

    patch: QMatrix
    patch_bias: np.ndarray
    positions: np.ndarray
    pre_norm: Norm | None
    layers: list[VisionLayer]
    post_norm: Norm | None
    head: dict[str, QMatrix | np.ndarray]


def _norm(t: Tensors, name: str, n: int) -> Norm:
    return Norm(t.vec(f"{name}.weight", n), t.vec(f"{name}.bias", n))


def _opt_norm(t: Tensors, name: str, n: int) -> Norm | None:
    """A LayerNorm's weight and bias, or an RMSNorm's weight (bias empty), when the file has it."""
    if not t.has(f"{name}.weight"):
        return None
    return Norm(t.vec(f"{name}.weight", n), _bias(t, f"{name}.bias", n))


def _bias(t: Tensors, name: str, n: int) -> np.ndarray:
    """A bias the file may lack (pixtral's blocks have none): float32 [n], or empty."""
    return t.vec(name, n) if t.has(name) else _EMPTY


def _rms_layer(t: Tensors, cfg: VisionConfig, i: int) -> VisionLayer:
    """pixtral, qwen2.5vl: RMSNorms (weights only), attention and a SwiGLU MLP (biases: qwen2.5vl's)."""
    p, d, f = f"v.blk.{i}", cfg.d_model, cfg.ffn_dim
    return VisionLayer(
        ln1=Norm(t.vec(f"{p}.ln1.weight", d), _EMPTY), ln2=Norm(t.vec(f"{p}.ln2.weight", d), _EMPTY),
        wq=t.mat(f"{p}.attn_q.weight", d, d), wk=t.mat(f"{p}.attn_k.weight", d, d),
        wv=t.mat(f"{p}.attn_v.weight", d, d), wo=t.mat(f"{p}.attn_out.weight", d, d),
        w_up=t.mat(f"{p}.ffn_up.weight", f, d), w_down=t.mat(f"{p}.ffn_down.weight", d, f),
        w_gate=t.mat(f"{p}.ffn_gate.weight", f, d), b_gate=_bias(t, f"{p}.ffn_gate.bias", f),
        bq=_bias(t, f"{p}.attn_q.bias", d), bk=_bias(t, f"{p}.attn_k.bias", d), bv=_bias(t, f"{p}.attn_v.bias", d),
        bo=_bias(t, f"{p}.attn_out.bias", d), b_up=_bias(t, f"{p}.ffn_up.bias", f),
        b_down=_bias(t, f"{p}.ffn_down.bias", d))


def _layer(t: Tensors, cfg: VisionConfig, i: int) -> VisionLayer:
    if cfg.norm == "rms":
        return _rms_layer(t, cfg, i)
    p, d, f = f"v.blk.{i}", cfg.d_model, cfg.ffn_dim
    return VisionLayer(
        ln1=_norm(t, f"{p}.ln1", d), ln2=_norm(t, f"{p}.ln2", d),
        wq=t.mat(f"{p}.attn_q.weight", d, d), wk=t.mat(f"{p}.attn_k.weight", d, d),
        wv=t.mat(f"{p}.attn_v.weight", d, d), wo=t.mat(f"{p}.attn_out.weight", d, d),
        w_up=t.mat(f"{p}.ffn_up.weight", f, d), w_down=t.mat(f"{p}.ffn_down.weight", d, f),
        bq=t.vec(f"{p}.attn_q.bias", d), bk=t.vec(f"{p}.attn_k.bias", d), bv=t.vec(f"{p}.attn_v.bias", d),
        bo=t.vec(f"{p}.attn_out.bias", d), b_up=t.vec(f"{p}.ffn_up.bias", f), b_down=t.vec(f"{p}.ffn_down.bias", d))


def _conv_kernel(f: GGUFFile, t: Tensors, cfg: VisionConfig, name: str) -> np.ndarray:
    """A patch convolution kernel [p, p, 3, d_model] (ggml order) as float32 [d_model, 3 * p * p]."""
    p, d = cfg.patch_size, cfg.d_model
    info = f.tensors.get(name)
    if info is None:
        raise UnsupportedModelError(f"{f.path}: missing tensor {name!r}")
    if tuple(info.shape) != (p, p, 3, d):
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has shape {info.shape}, expected {(p, p, 3, d)}")
    t.used.add(name)
    return np.asarray(dequantize(info), np.float32).reshape(d, 3 * p * p)


def _patch_matrix(f: GGUFFile, t: Tensors, cfg: VisionConfig) -> QMatrix:
    """v.patch_embd.weight as d_model rows of 3 * p * p; qwen2.5vl's second temporal kernel
    (v.patch_embd.weight.1: the converter splits the Conv3D over 2 frames, and a still image
    is both frames) added in: one convolution by the sum."""
    kernel = _conv_kernel(f, t, cfg, "v.patch_embd.weight")
    if cfg.projector == QWEN25VL:
        kernel = kernel + _conv_kernel(f, t, cfg, "v.patch_embd.weight.1")
    return float_matrix(kernel, "v.patch_embd.weight")


def _head(f: GGUFFile, t: Tensors, cfg: VisionConfig) -> dict[str, QMatrix | np.ndarray]:
    d, n = cfg.d_model, cfg.text_dim
    if cfg.projector == QWEN25VL:  # the merger's MLP over each 2 x 2 patch group: mm.0 + bias, GELU, mm.2 + bias
        shape = t.shape("mm.0.weight")
        hidden = shape[1] if shape is not None and len(shape) == 2 else 0
        return {"mm0": t.mat("mm.0.weight", hidden, 4 * d), "b0": t.vec("mm.0.bias", hidden),
                "mm2": t.mat("mm.2.weight", n, hidden), "b2": t.vec("mm.2.bias", n)}
    if cfg.projector == "idefics3":  # the pixel-shuffled rows' projection
        return {"fc": t.mat("mm.model.fc.weight", n, d * cfg.n_merge**2)}
    if cfg.projector == "pixtral":  # (a patch merger,) then mm.1 + bias, GELU, mm.2 + bias; [IMG_BREAK]
        wide = d * cfg.n_merge**2
        shape = t.shape("mm.1.weight")
        hidden = shape[1] if shape is not None and len(shape) == 2 else 0
        out: dict[str, QMatrix | np.ndarray] = {
            "mm1": t.mat("mm.1.weight", hidden, d), "b1": _bias(t, "mm.1.bias", hidden),
            "mm2": t.mat("mm.2.weight", n, hidden), "b2": _bias(t, "mm.2.bias", n),
            "img_break": t.vec("v.token_embd.img_break", n)}
        if t.has("mm.patch_merger.weight"):  # Mistral Small 3.1: RMSNorm, s x s patches unfolded, projected
            out["norm_w"] = t.vec("mm.input_norm.weight", d)
            out["merger"] = t.mat("mm.patch_merger.weight", d, wide)
        return out
    if cfg.projector == "lfm2":  # LayerNorm (weight, bias optional), then up + bias, GELU, down + bias
        wide = d * cfg.n_merge**2
        shape = t.shape("mm.1.weight")
        hidden = shape[1] if shape is not None and len(shape) == 2 else 0
        head: dict[str, QMatrix | np.ndarray] = {
            "mm1": t.mat("mm.1.weight", hidden, wide), "b1": t.vec("mm.1.bias", hidden),
            "mm2": t.mat("mm.2.weight", n, hidden), "b2": t.vec("mm.2.bias", n)}
        if t.has("mm.input_norm.weight"):
            head["norm_w"] = t.vec("mm.input_norm.weight", wide)
            head["norm_b"] = t.vec("mm.input_norm.bias", wide) if t.has("mm.input_norm.bias") else np.zeros(wide, np.float32)
        return head
    # gemma3: cur @ W where W is stored [d_model, text_dim] (numpy order): a [text_dim, d_model] matrix
    name = "mm.input_projection.weight"
    info = f.tensors.get(name)
    if info is None or tuple(info.shape) != (n, d):
        got = None if info is None else info.shape
        raise UnsupportedModelError(f"{f.path}: tensor {name!r} has shape {got}, expected {(n, d)}")
    t.used.add(name)
    proj = np.asarray(dequantize(info), np.float32).reshape(d, n).T
    return {"proj": float_matrix(proj, name), "soft_norm": t.vec("mm.soft_emb_norm.weight", d)}


def load_vision_weights(f: GGUFFile, cfg: VisionConfig, backend: Backend) -> VisionWeights:
    """The tower's weights, matrices in the backend's form; refuses tensors it would ignore."""
    t = Tensors(f, backend.matrix_types)
    d = cfg.d_model
    pos = (_EMPTY.reshape(0, d) if cfg.rope_theta else  # pixtral: 2-D RoPE, no learned positions
           t.vec("v.position_embd.weight", cfg.n_patches * d).reshape(cfg.n_patches, d))  # raster order
    w = VisionWeights(
        patch=_patch_matrix(f, t, cfg), patch_bias=_bias(t, "v.patch_embd.bias", d), positions=pos,
        pre_norm=_opt_norm(t, "v.pre_ln", d), layers=[_layer(t, cfg, i) for i in range(cfg.n_layers)],
        post_norm=_opt_norm(t, "v.post_ln", d), head=_head(f, t, cfg))
    t.refuse_unused(f"{cfg.projector} projector")
    names = ("wq", "wk", "wv", "wo", "w_up", "w_down", "w_gate")
    flat = [(lw, n) for lw in w.layers for n in names if getattr(lw, n) is not None]
    heads = [k for k in ("fc", "mm0", "mm1", "mm2", "merger") if isinstance(w.head.get(k), QMatrix)]  # the file's own
    prepared = backend.prepare_weights(f, [("layer", getattr(lw, n)) for lw, n in flat]
                                       + [("layer", w.head[k]) for k in heads])
    for (lw, n), m in zip(flat, prepared):
        setattr(lw, n, m)
    for k, m in zip(heads, prepared[len(flat):]):
        w.head[k] = m
    return w
