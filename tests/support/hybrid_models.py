"""Tiny random-weight GGUFs of the hybrid recurrent architectures, in the tensor layout and
metadata llama.cpp loads (its src/models/<arch>.cpp), for the llama.cpp comparison in
tests/models/test_hybrid_architectures.py. Weights are sized so every part bites: the
convolution's taps are large (a token's output depends on its neighbours), and the attention
layers reach back over the whole sequence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from tiny_models import VOCAB_SIZE, _add_tokenizer, _Weights, finish

# LFM2's layer kinds, shortened: a convolution first and last (the last layer's row selection)
LFM2_LAYERS = ("conv", "attn", "conv", "conv", "attn", "conv")


def write_lfm2(path: Path, *, qtype: str = "F32", layers: tuple[str, ...] = LFM2_LAYERS, d_model: int = 64,
               n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 128, l_cache: int = 3, context_length: int = 256,
               conv_std: float = 0.6, seed: int = 0, sliding_window: int = 0, output_std: float = 0.5) -> Path:
    """An lfm2 model: `layers` names each layer's kind ("conv" or "attn"); l_cache the
    convolution's width in tokens; a tied output (as LFM2's)."""
    arch, hd = "lfm2", d_model // n_heads
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny random model")
    for key, value in {"block_count": len(layers), "embedding_length": d_model, "attention.head_count": n_heads,
                       "feed_forward_length": ffn, "context_length": context_length, "shortconv.l_cache": l_cache,
                       "vocab_size": VOCAB_SIZE}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_array(f"{arch}.attention.head_count_kv", [n_kv_heads if k == "attn" else 0 for k in layers])
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if sliding_window:
        w.add_uint32(f"{arch}.attention.sliding_window", sliding_window)
    _add_tokenizer(w, add_bos=True)
    wt = _Weights(w, qtype, seed, widen=float(np.sqrt(64 / d_model)))
    wt.matrix("token_embd.weight", VOCAB_SIZE, d_model, std=output_std)
    wt.vector("token_embd_norm.weight", d_model, mean=1.0)
    for i, kind in enumerate(layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
        wt.vector(p + "ffn_norm.weight", d_model, mean=1.0)
        if kind == "attn":
            wt.matrix(p + "attn_q.weight", d_model, d_model, std=0.2)
            wt.matrix(p + "attn_k.weight", n_kv_heads * hd, d_model, std=0.2)
            wt.matrix(p + "attn_v.weight", n_kv_heads * hd, d_model, std=0.3)
            wt.matrix(p + "attn_output.weight", d_model, d_model, std=0.3)
            wt.vector(p + "attn_q_norm.weight", hd, mean=1.0, std=0.2)
            wt.vector(p + "attn_k_norm.weight", hd, mean=1.0, std=0.2)
        else:
            wt.matrix(p + "shortconv.in_proj.weight", 3 * d_model, d_model, std=0.3)
            # [D, L] taps (GGUF shape (L, D)), kept in float32 as llama.cpp's quantizer keeps them
            w.add_tensor(p + "shortconv.conv.weight", wt.rng.normal(0.0, conv_std, (d_model, l_cache)).astype(np.float32))
            wt.matrix(p + "shortconv.out_proj.weight", d_model, d_model, std=0.3)
        wt.matrix(p + "ffn_gate.weight", ffn, d_model)
        wt.matrix(p + "ffn_up.weight", ffn, d_model)
        wt.matrix(p + "ffn_down.weight", d_model, ffn, std=0.3)
    finish(w)
    return path
