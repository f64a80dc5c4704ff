"""A slow, plain NumPy forward pass of the llama, qwen2 and gemma3 architectures: the oracle the
fast forward (edge_infer.models.transformer + kernels_cpu) is checked against.

Written from llama.cpp's graphs (src/models/llama.cpp, qwen2.cpp, gemma3.cpp) and ggml's CPU
ops, sharing nothing with edge_infer's kernels or model config: hyper-parameters come straight
from the GGUF metadata and weights from the reference dequantizer (bit-exact with gguf-py).
Everything is computed in float64 except the storage of the embedding and output matrices,
which are dequantized in float32 slices (rows on demand, vocabulary chunks for the logits).
The sequence goes through the model one layer at a time, so only one layer's weights are in
memory at once.

What llama.cpp does, and so what this does:
- RMSNorm: x / sqrt(mean(x^2) + eps) * w (gemma's GGUF norm weights already hold the +1).
- RoPE on the first n_rot dims of each head, angle p * base^(-2i/n_rot): llama rotates
  adjacent pairs (2i, 2i+1) ("normal" mode, the converter permuted Q/K for it); qwen2 and
  gemma3 rotate (i, i + n_rot/2) (NEOX mode).
- GQA: query head h reads kv head h // (n_head / n_head_kv); causal softmax(q.k * scale) v.
- qwen2: biases on Q, K and V (added wherever the file has them, as llama.cpp does).
- gemma3: embeddings times sqrt(d_model); RMSNorm of each Q and K head (QK-norm) before RoPE;
  query scale 1/sqrt(head_dim) (d_model/n_head for the 62-layer 27B); RMSNorm after the
  attention output and after the FFN, before each residual add; GeGLU with the tanh GELU;
  sliding-window attention (a key at j is visible from p if p - j < window) with rope base
  `rope.freq_base_swa` (10000) on layers i % pattern < pattern - 1 (pattern 6), the file's
  rope base on the others; optional final logit soft-capping.
- SwiGLU (silu(gate) * up) for llama and qwen2.
- Tied output: token_embd.weight when output.weight is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.quants import dequantize, dequantize_blocks

ARCHS = ("llama", "qwen2", "gemma3")


@dataclass(frozen=True)
class RefConfig:
    arch: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_rot: int
    ffn_dim: int
    eps: float
    rope_base: float
    rope_base_swa: float
    window: int  # 0: no sliding window anywhere
    swa_pattern: int
    softcap: float

    def is_swa(self, layer: int) -> bool:
        return self.window > 0 and layer % self.swa_pattern < self.swa_pattern - 1


def read_config(f: GGUFFile) -> RefConfig:
    md = f.metadata
    arch = md["general.architecture"]
    if arch not in ARCHS:
        raise ValueError(f"reference forward: architecture {arch!r} not covered ({ARCHS})")

    def get(key: str, default: object = None) -> object:
        v = md.get(f"{arch}.{key}", default)
        if v is None:
            raise KeyError(f"{arch}.{key}")
        return v

    for key in ("rope.scaling.type", "rope.scaling.factor"):
        scaling = md.get(f"{arch}.{key}")
        if scaling not in (None, "none", "", 1.0):
            raise ValueError(f"reference forward: rope scaling {key}={scaling!r} not covered")
    if "rope_freqs.weight" in f.tensors:
        raise ValueError("reference forward: rope frequency factors (llama3 rope) not covered")
    d_model = int(get("embedding_length"))
    n_heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", d_model // n_heads))
    gemma = arch == "gemma3"
    return RefConfig(
        arch=arch,
        n_layers=int(get("block_count")),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        n_rot=int(get("rope.dimension_count", head_dim)),
        ffn_dim=int(get("feed_forward_length")),
        eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_base=float(get("rope.freq_base", 10000.0)),
        rope_base_swa=float(get("rope.freq_base_swa", 10000.0)) if gemma else 0.0,
        window=int(get("attention.sliding_window", 0)) if gemma else 0,
        swa_pattern=int(get("attention.sliding_window_pattern", 6)) if gemma else 1,
        softcap=float(get("final_logit_softcapping", 0.0)) if gemma else 0.0,
    )


# -- weights -------------------------------------------------------------------------------
def _tensor(f: GGUFFile, name: str) -> TensorInfo:
    if name not in f.tensors:
        raise KeyError(f"{f.path}: missing tensor {name!r}")
    return f.tensors[name]


def _w(f: GGUFFile, name: str) -> np.ndarray:
    """A weight matrix [out, in] (or a vector) in float64."""
    return dequantize(_tensor(f, name)).astype(np.float64)


def _rows(t: TensorInfo, rows: np.ndarray | slice) -> np.ndarray:
    """float32 rows of a 2-D tensor [n_rows, row_len], dequantized from their bytes only."""
    row_len, n_rows = t.shape
    raw = t.data.reshape(n_rows, -1)[rows]
    return dequantize_blocks(raw, t.type, raw.shape[0] * row_len).reshape(-1, row_len)


def _matmul(x: np.ndarray, f: GGUFFile, name: str) -> np.ndarray:
    """x [T, in] @ W.T for the weight `name` [out, in]."""
    return x @ _w(f, name).T


# -- ops -----------------------------------------------------------------------------------
def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis, times w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool) -> np.ndarray:
    """Rotary embedding of x [T, H, D] at positions pos [T]; dims past n_rot are unchanged."""
    half = n_rot // 2
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * np.arange(half) / n_rot)  # [T, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int) -> np.ndarray:
    """Causal (optionally sliding-window) GQA attention. q [T, H, D]; k, v [T, Hkv, D]; the
    tokens are at positions 0..T-1 of one sequence. Returns [T, H * D]."""
    T, H, D = q.shape
    rep = H // k.shape[1]
    # contiguous [H, T, D] stacks, so that matmul runs BLAS per head
    qh = np.ascontiguousarray(q.transpose(1, 0, 2))
    kh = np.repeat(np.ascontiguousarray(k.transpose(1, 0, 2)), rep, axis=0)  # head h <- kv head h // rep
    vh = np.repeat(np.ascontiguousarray(v.transpose(1, 0, 2)), rep, axis=0)
    s = (qh @ np.ascontiguousarray(kh.transpose(0, 2, 1))) * scale  # [H, T(query), T(key)]
    p = np.arange(T)
    allowed = p[None, :] <= p[:, None]
    if window > 0:
        allowed &= p[:, None] - p[None, :] < window
    s = np.where(allowed[None], s, -np.inf)
    s -= s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    e /= e.sum(axis=-1, keepdims=True)
    return (e @ vh).transpose(1, 0, 2).reshape(T, H * D)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


# -- the model -----------------------------------------------------------------------------
def _layer(f: GGUFFile, cfg: RefConfig, il: int, h: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """One decoder block on the residual stream h [T, d_model] (float64); returns the new h."""
    p = f"blk.{il}."
    T = h.shape[0]
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    gemma = cfg.arch == "gemma3"
    x = rmsnorm(h, _w(f, p + "attn_norm.weight"), cfg.eps)
    q = _matmul(x, f, p + "attn_q.weight")
    k = _matmul(x, f, p + "attn_k.weight")
    v = _matmul(x, f, p + "attn_v.weight")
    for other in ("attn_output.bias", "ffn_gate.bias", "ffn_up.bias", "ffn_down.bias"):
        if p + other in f.tensors:
            raise ValueError(f"reference forward: tensor {p + other} not covered")
    if p + "attn_q.bias" in f.tensors:  # qwen2 (llama.cpp adds Q/K/V biases wherever present)
        q += _w(f, p + "attn_q.bias")
        k += _w(f, p + "attn_k.bias")
        v += _w(f, p + "attn_v.bias")
    q, k, v = q.reshape(T, H, D), k.reshape(T, Hkv, D), v.reshape(T, Hkv, D)
    if gemma:
        q = rmsnorm(q, _w(f, p + "attn_q_norm.weight"), cfg.eps)
        k = rmsnorm(k, _w(f, p + "attn_k_norm.weight"), cfg.eps)
    swa = cfg.is_swa(il)
    base = cfg.rope_base_swa if swa else cfg.rope_base
    neox = cfg.arch in ("qwen2", "gemma3")
    q = rope(q, pos, cfg.n_rot, base, neox)
    k = rope(k, pos, cfg.n_rot, base, neox)
    if gemma and cfg.n_layers == 62:  # gemma3 27B: query_pre_attn_scalar = d_model / n_heads
        scale = 1.0 / math.sqrt(cfg.d_model // H)
    else:
        scale = 1.0 / math.sqrt(D)
    a = attention(q, k, v, scale, cfg.window if swa else 0)
    o = _matmul(a, f, p + "attn_output.weight")
    if gemma:
        o = rmsnorm(o, _w(f, p + "post_attention_norm.weight"), cfg.eps)
    h = h + o
    x = rmsnorm(h, _w(f, p + "ffn_norm.weight"), cfg.eps)
    gate = _matmul(x, f, p + "ffn_gate.weight")
    up = _matmul(x, f, p + "ffn_up.weight")
    act = (gelu_tanh(gate) if gemma else silu(gate)) * up
    down = _matmul(act, f, p + "ffn_down.weight")
    if gemma:
        down = rmsnorm(down, _w(f, p + "post_ffw_norm.weight"), cfg.eps)
    return h + down


def reference_logits(path: str | Path, tokens: list[int], vocab_chunk: int = 16384) -> np.ndarray:
    """Logits [len(tokens), vocab] (float32 storage of float64 results) of the tokens as one
    sequence at positions 0..n-1; row i predicts token i + 1."""
    with GGUFFile(str(path)) as f:
        return _forward(f, tokens, vocab_chunk)


def _forward(f: GGUFFile, tokens: list[int], vocab_chunk: int) -> np.ndarray:
    cfg = read_config(f)
    ids = np.asarray(tokens, dtype=np.int64)
    pos = np.arange(len(ids))
    emb = _tensor(f, "token_embd.weight")
    h = _rows(emb, ids).astype(np.float64)
    if cfg.arch == "gemma3":
        h *= math.sqrt(cfg.d_model)
    for il in range(cfg.n_layers):
        h = _layer(f, cfg, il, h, pos)
    x = rmsnorm(h, _w(f, "output_norm.weight"), cfg.eps)
    out_w = f.tensors.get("output.weight", emb)  # tied embeddings
    vocab = out_w.shape[1]
    logits = np.empty((len(ids), vocab), np.float32)
    for r0 in range(0, vocab, vocab_chunk):
        r1 = min(vocab, r0 + vocab_chunk)
        z = x @ _rows(out_w, slice(r0, r1)).astype(np.float64).T
        if cfg.softcap:
            z = np.tanh(z / cfg.softcap) * cfg.softcap
        logits[:, r0:r1] = z
    return logits
