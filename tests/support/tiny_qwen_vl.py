"""A tiny random-weight Qwen2.5-VL pair (a "qwen2vl" text model plus a "qwen2.5vl_merger"
mmproj) in the layout llama.cpp's converter (conversion/qwenvl.py) writes and its libmtmd loads
(tools/mtmd/clip.cpp, models/qwen2vl.cpp; src/models/qwen2vl.cpp), for comparing our image
pipeline with mtmd (tests/support/mtmd_oracle.py).

Vision tower: the Conv3D patch kernel split into two Conv2D kernels (v.patch_embd.weight and
v.patch_embd.weight.1, no bias, no position embedding), RMS-norm blocks with biased Q/K/V/O and a
biased SwiGLU FFN, 2D M-RoPE, window attention except every n_wa_pattern-th block, then the
merger: RMS norm (v.post_ln), 2x2 patch merge, mm.0 -> GELU -> mm.2. Text model: qwen2 with
Q/K/V biases and M-RoPE (rope.dimension_sections). The vocabulary is tiny_vlm's byte-level BPE
plus the Qwen vision markers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter
from tiny_models import BYTE_ENCODER, MERGES, SPECIALS, _Weights, finish
from tiny_vlm import (
    _LINEAR,
    NEWLINE2,
    PIXTRAL_MEAN,
    PIXTRAL_STD,
    _clip_writer,
    _lin,
    _norm,
    add_tiny_vocab,
    png_bytes,
    test_image,
)

__all__ = ["QWEN_MARKERS", "png_bytes", "qwen_vocab", "test_image", "write_tiny_qwen_vl",
           "write_tiny_qwen_vl_mmproj", "write_tiny_qwen_vl_text"]

QWEN_MARKERS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]  # mtmd writes the first two
CLIP_MEAN, CLIP_STD = PIXTRAL_MEAN, PIXTRAL_STD  # Qwen2.5-VL's preprocessor_config: OpenAI CLIP's
Q8_BLOCK = 32


def qwen_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): bytes, merges (with "ĊĊ"), control tokens, QWEN_MARKERS."""
    merges = [*MERGES, NEWLINE2]
    specials = [*SPECIALS, *QWEN_MARKERS]
    tokens = list(BYTE_ENCODER) + [a + b for a, b in merges] + specials
    types = [1] * (len(tokens) - len(specials)) + [3] * len(specials)  # 1 normal, 3 control
    return tokens, types, [f"{a} {b}" for a, b in merges]


def write_tiny_qwen_vl_text(
    path: str | Path,
    *,
    seed: int = 0,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    context_length: int = 4096,
    sections: tuple[int, int, int, int] = (2, 3, 3, 0),
    rope_base: float = 1000000.0,
) -> Path:
    """The "qwen2vl" text model (F32, BOS added, untied output): head_dim d_model / n_heads is
    rope.dimension_count, and the M-RoPE sections (t, h, w, unused; in rotated pairs) must sum
    to head_dim / 2, as Qwen2.5-VL's mrope_section does."""
    hd = d_model // n_heads
    if d_model % n_heads or n_heads % n_kv_heads or hd % 2:
        raise ValueError("need d_model divisible by n_heads, n_heads by n_kv_heads, and an even head_dim")
    if len(sections) != 4 or 2 * sum(sections) != hd:
        raise ValueError(f"the 4 rope sections must sum to head_dim / 2 = {hd // 2}, got {sections}")
    path = Path(path)
    if path.is_dir():
        path = path / "tiny-qwen2vl-f32.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    arch = "qwen2vl"
    tokens, types, merges = qwen_vocab()
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), arch)
    w.add_name("tiny qwen2.5-vl text qwen2vl")
    for key, value in {"block_count": n_layers, "embedding_length": d_model, "attention.head_count": n_heads,
                       "attention.head_count_kv": n_kv_heads, "feed_forward_length": ffn,
                       "context_length": context_length, "rope.dimension_count": hd}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", rope_base)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_rope_dimension_sections([int(s) for s in sections])  # an INT32 array of 4
    add_tiny_vocab(w, tokens, types, merges)

    wt = _Weights(w, "F32", seed)
    q_dim, kv_dim = n_heads * hd, n_kv_heads * hd
    wt.matrix("token_embd.weight", n_vocab, d_model, std=0.5)
    wt.vector("output_norm.weight", d_model, mean=1.0)
    wt.matrix("output.weight", n_vocab, d_model, std=0.5)
    for i in range(n_layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
        wt.matrix(p + "attn_q.weight", q_dim, d_model, std=0.2)
        wt.matrix(p + "attn_k.weight", kv_dim, d_model, std=0.2)
        wt.matrix(p + "attn_v.weight", kv_dim, d_model)
        wt.vector(p + "attn_q.bias", q_dim, std=0.1)
        wt.vector(p + "attn_k.bias", kv_dim, std=0.1)
        wt.vector(p + "attn_v.bias", kv_dim, std=0.05)
        wt.matrix(p + "attn_output.weight", d_model, q_dim)
        wt.vector(p + "ffn_norm.weight", d_model, mean=1.0)
        wt.matrix(p + "ffn_gate.weight", ffn, d_model)
        wt.matrix(p + "ffn_up.weight", ffn, d_model)
        wt.matrix(p + "ffn_down.weight", d_model, ffn)
    finish(w)
    return path


def _mat(w: GGUFWriter, rng: np.random.Generator, name: str, rows: int, cols: int) -> None:
    """tiny_vlm's _lin (biased); a Q8_0 matrix whose rows are not whole blocks is stored F16,
    the converter's fallback."""
    fallback = _LINEAR[0] == "Q8_0" and cols % Q8_BLOCK != 0
    if fallback:
        _LINEAR[0] = "F16"
    try:
        _lin(w, rng, name, rows, cols)
    finally:
        if fallback:
            _LINEAR[0] = "Q8_0"


def write_tiny_qwen_vl_mmproj(
    path: str | Path,
    *,
    seed: int = 1,
    linear_type: str = "F32",
    image_size: int = 560,
    patch_size: int = 14,
    n_embd: int = 32,
    n_layer: int = 4,
    n_head: int = 2,
    n_ff: int = 48,
    text_embd: int = 64,
    mm_hidden: int = 96,
    n_wa_pattern: int = 2,
    eps: float = 1e-6,
) -> Path:
    """The "qwen2.5vl_merger" mmproj: blocks (n_wa_pattern - 1, 2 * n_wa_pattern - 1, ... attend
    fully, the others within 112-pixel windows) and merger MLP (mm.0 [mm_hidden, 4 * n_embd],
    mm.2 [text_embd, mm_hidden]) with matrices of linear_type (F32, F16 or Q8_0; a Q8_0 matrix
    whose input width is not a multiple of 32 falls back to F16); the patch kernels and norms F32."""
    if linear_type not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"linear_type must be F32, F16 or Q8_0, got {linear_type!r}")
    if n_ff == n_embd:  # clip.cpp would take ffn_down for ffn_up (its legacy-swap check)
        raise ValueError("n_ff must differ from n_embd")
    if n_embd % n_head or (n_embd // n_head) % 4:
        raise ValueError("the vision M-RoPE needs head_dim = n_embd / n_head divisible by 4")
    if n_wa_pattern < 0:
        raise ValueError("n_wa_pattern must be >= 0 (0: no window attention)")
    path = Path(path)
    if path.is_dir():
        path = path / "mmproj-tiny-qwen2.5vl-f32.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)

    w = _clip_writer(path, "tiny qwen2.5-vl mmproj", "qwen2.5vl_merger", text_embd, image_size, patch_size, n_embd,
                     n_ff, n_layer, n_head, CLIP_MEAN, CLIP_STD, eps)
    w.add_vision_use_silu(True)
    w.add_vision_n_wa_pattern(n_wa_pattern)

    rng = np.random.default_rng(seed)
    std = 1.0 / np.sqrt(2 * 3 * patch_size**2)  # the two temporal halves add up
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):  # [n_embd, 3, p, p]: GGUF ne [p, p, 3, n_embd]
        w.add_tensor(name, rng.normal(0.0, std, (n_embd, 3, patch_size, patch_size)).astype(np.float32))
    _LINEAR[0] = linear_type
    try:
        for i in range(n_layer):
            p = f"v.blk.{i}."
            for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
                _mat(w, rng, p + name, n_embd, n_embd)
            _norm(w, rng, p + "ln1", n_embd, bias=False)  # norm1 / norm2: Qwen2RMSNorm
            _norm(w, rng, p + "ln2", n_embd, bias=False)
            _mat(w, rng, p + "ffn_gate", n_ff, n_embd)  # gate_proj
            _mat(w, rng, p + "ffn_up", n_ff, n_embd)  # up_proj
            _mat(w, rng, p + "ffn_down", n_embd, n_ff)  # down_proj
        _norm(w, rng, "v.post_ln", n_embd, bias=False)  # merger.ln_q
        _mat(w, rng, "mm.0", mm_hidden, 4 * n_embd)  # merger.mlp.0 (input: the 2x2 patches' features)
        _mat(w, rng, "mm.2", text_embd, mm_hidden)  # merger.mlp.2
    finally:
        _LINEAR[0] = "F32"
    finish(w)
    return path


def write_tiny_qwen_vl(folder: str | Path, *, seed: int = 0, **mmproj: Any) -> tuple[Path, Path]:
    """(text model, mmproj) in `folder` with matching widths: the text model's d_model is the
    mmproj's text_embd (a multiple of 32), with head_dim 16 (n_heads = text_embd / 16)."""
    folder = Path(folder)
    text_embd = int(mmproj.get("text_embd", 64))
    if text_embd % 32:
        raise ValueError("text_embd must be a multiple of 32")
    text = write_tiny_qwen_vl_text(folder / "tiny-qwen2.5vl-text.gguf", seed=seed, d_model=text_embd,
                                   n_heads=text_embd // 16)
    proj = write_tiny_qwen_vl_mmproj(folder / "tiny-qwen2.5vl-mmproj.gguf", seed=seed + 1, **mmproj)
    return text, proj
