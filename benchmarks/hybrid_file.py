"""A random LFM2-1.2B-shaped GGUF for benchmarks/bench_hybrid.py, written directly as random
valid Q4_K blocks (moe_file.q4k_rows):

    python benchmarks/hybrid_file.py [OUT.gguf]

lfm2, 16 layers (10 gated short convolutions of width 3, 6 GQA attention layers, in LFM2-1.2B's
order), width 2048, FFN 8192, 32/8 heads of 64, tied embeddings; SmolLM2's tokenizer (49152
tokens, not LFM2's 65536: the output matrix is 25% narrower than the real model's). The
convolution taps stay F32, norms F32, every matrix Q4_K. Written through a temporary name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from moe_file import q4k_rows, smollm2_writer, write_tensors

ARCH = "lfm2"
LAYERS = ("conv", "conv", "attn", "conv", "conv", "attn", "conv", "conv", "attn", "conv", "attn", "conv", "attn",
          "conv", "attn", "conv")
D, FF, N_HEADS, N_KV, HD, L_CACHE = 2048, 8192, 32, 8, 64, 3
DEFAULT_PATH = Path.home() / ".cache" / "edge-infer" / "bench" / "lfm2-1.2b-shape-q4k.gguf"


def _tensors(vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, numpy-order element shape) in file order."""
    yield "token_embd.weight", (vocab, D)
    yield "token_embd_norm.weight", (D,)
    for i, kind in enumerate(LAYERS):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (D,)
        yield p + "ffn_norm.weight", (D,)
        if kind == "attn":
            for name, shape in (("attn_q", (D, D)), ("attn_k", (N_KV * HD, D)), ("attn_v", (N_KV * HD, D)),
                                ("attn_output", (D, D)), ("attn_q_norm", (HD,)), ("attn_k_norm", (HD,))):
                yield p + name + ".weight", shape
        else:
            yield p + "shortconv.in_proj.weight", (3 * D, D)
            yield p + "shortconv.conv.weight", (D, L_CACHE)
            yield p + "shortconv.out_proj.weight", (D, D)
        for name, shape in (("ffn_gate", (FF, D)), ("ffn_up", (FF, D)), ("ffn_down", (D, FF))):
            yield p + name + ".weight", shape


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) > 1 and "shortconv.conv" not in name


def _data(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    if not _quantized(name, shape):
        return rng.normal(0.0, 0.5, shape).astype(np.float32)
    std = 0.05 if "token_embd" in name else 0.02  # tied: the output matrix too (logits of std ~4)
    return q4k_rows(rng, shape[0], shape[1], std)


def write_hybrid_file(path: Path, seed: int = 0) -> Path:
    """Writes the file at path (through a temporary name: never half-written); returns path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    w, vocab = smollm2_writer(tmp, ARCH, "random lfm2 benchmark model")
    for key, value in {"block_count": len(LAYERS), "embedding_length": D, "attention.head_count": N_HEADS,
                       "feed_forward_length": FF, "context_length": 32768, "shortconv.l_cache": L_CACHE,
                       "vocab_size": vocab}.items():
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_array(f"{ARCH}.attention.head_count_kv", [N_KV if k == "attn" else 0 for k in LAYERS])
    w.add_float32(f"{ARCH}.rope.freq_base", 1e6)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    rng = np.random.default_rng(seed)
    write_tensors(w, list(_tensors(vocab)), _quantized, lambda name, shape: _data(rng, name, shape))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    print(write_hybrid_file(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH))
