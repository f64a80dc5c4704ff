"""Random hybrid GGUFs of real models' shapes for benchmarks/bench_hybrid.py, written directly
as random valid Q4_K blocks (moe_file.q4k_rows):

    python benchmarks/hybrid_file.py [--shape lfm2-1.2b|qwen35-0.8b] [OUT.gguf]

lfm2-1.2b: lfm2, 16 layers (10 gated short convolutions of width 3, 6 GQA attention layers, in
LFM2-1.2B's order), width 2048, FFN 8192, 32/8 heads of 64, tied embeddings.
qwen35-0.8b: qwen35, 24 layers (18 Gated DeltaNet, every 4th gated attention), width 1024, FFN
3584, attention 8/2 heads of 256 with 64 rotary dims (sections 11/11/10), DeltaNet 16 key and
16 value heads of 128, convolution 4, tied embeddings.
Both take SmolLM2's tokenizer (49152 tokens; the real ones have 65536 and 248k: their output
matrices are larger). Convolution taps and the SSM's vectors stay F32, norms F32, every matrix
Q4_K. Written through a temporary name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from moe_file import q4k_rows, smollm2_writer, write_tensors

ARCH = "lfm2"
LAYERS = ("conv", "conv", "attn", "conv", "conv", "attn", "conv", "conv", "attn", "conv", "attn", "conv", "attn",
          "conv", "attn", "conv")
D, FF, N_HEADS, N_KV, HD, L_CACHE = 2048, 8192, 32, 8, 64, 3
BENCH_DIR = Path.home() / ".cache" / "edge-infer" / "bench"
DEFAULT_PATH = BENCH_DIR / "lfm2-1.2b-shape-q4k.gguf"
SHAPES = ("lfm2-1.2b", "qwen35-0.8b")
Q_D, Q_FF, Q_LAYERS, Q_HEADS, Q_KV, Q_HD, Q_ROT, Q_VH, Q_KH, Q_S, Q_CONV = 1024, 3584, 24, 8, 2, 256, 64, 16, 16, 128, 4


def default_path(shape: str) -> Path:
    return BENCH_DIR / f"{shape}-shape-q4k.gguf"


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


def _qwen35_tensors(vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    q, kv, v, c = Q_HEADS * Q_HD, Q_KV * Q_HD, Q_VH * Q_S, 2 * Q_KH * Q_S + Q_VH * Q_S
    yield "token_embd.weight", (vocab, Q_D)
    yield "output_norm.weight", (Q_D,)
    for i in range(Q_LAYERS):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (Q_D,)
        yield p + "post_attention_norm.weight", (Q_D,)
        if (i + 1) % 4 == 0:
            for name, shape in (("attn_q", (2 * q, Q_D)), ("attn_k", (kv, Q_D)), ("attn_v", (kv, Q_D)),
                                ("attn_output", (Q_D, q)), ("attn_q_norm", (Q_HD,)), ("attn_k_norm", (Q_HD,))):
                yield p + name + ".weight", shape
        else:
            for name, shape in (("attn_qkv.weight", (c, Q_D)), ("attn_gate.weight", (v, Q_D)),
                                ("ssm_conv1d.weight", (c, Q_CONV)), ("ssm_dt.bias", (Q_VH,)), ("ssm_a", (Q_VH,)),
                                ("ssm_beta.weight", (Q_VH, Q_D)), ("ssm_alpha.weight", (Q_VH, Q_D)),
                                ("ssm_norm.weight", (Q_S,)), ("ssm_out.weight", (Q_D, v))):
                yield p + name, shape
        for name, shape in (("ffn_gate", (Q_FF, Q_D)), ("ffn_up", (Q_FF, Q_D)), ("ffn_down", (Q_D, Q_FF))):
            yield p + name + ".weight", shape


def _quantized(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) > 1 and "shortconv.conv" not in name and "ssm_conv1d" not in name


def _data(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name.endswith("ssm_a"):  # -exp(A_log): a decay per head
        return -np.exp(rng.uniform(-1.0, 0.5, shape)).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return rng.uniform(-4.5, -3.0, shape).astype(np.float32)
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    if not _quantized(name, shape):
        return rng.normal(0.0, 0.5, shape).astype(np.float32)
    std = 0.05 if "token_embd" in name else 0.02  # tied: the output matrix too (logits of std ~4)
    return q4k_rows(rng, shape[0], shape[1], std)


def write_hybrid_file(path: Path, seed: int = 0, shape: str = "lfm2-1.2b") -> Path:
    """Writes the file at path (through a temporary name: never half-written); returns path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    arch = "qwen35" if shape == "qwen35-0.8b" else ARCH
    w, vocab = smollm2_writer(tmp, arch, f"random {shape}-shaped benchmark model")
    if arch == ARCH:
        for key, value in {"block_count": len(LAYERS), "embedding_length": D, "attention.head_count": N_HEADS,
                           "feed_forward_length": FF, "context_length": 32768, "shortconv.l_cache": L_CACHE,
                           "vocab_size": vocab}.items():
            w.add_uint32(f"{ARCH}.{key}", value)
        w.add_array(f"{ARCH}.attention.head_count_kv", [N_KV if k == "attn" else 0 for k in LAYERS])
        specs = list(_tensors(vocab))
    else:
        for key, value in {"block_count": Q_LAYERS, "embedding_length": Q_D, "attention.head_count": Q_HEADS,
                           "attention.head_count_kv": Q_KV, "attention.key_length": Q_HD,
                           "attention.value_length": Q_HD, "feed_forward_length": Q_FF, "context_length": 32768,
                           "rope.dimension_count": Q_ROT, "ssm.conv_kernel": Q_CONV, "ssm.inner_size": Q_VH * Q_S,
                           "ssm.state_size": Q_S, "ssm.time_step_rank": Q_VH, "ssm.group_count": Q_KH,
                           "full_attention_interval": 4, "vocab_size": vocab}.items():
            w.add_uint32(f"{arch}.{key}", value)
        w.add_array(f"{arch}.rope.dimension_sections", [11, 11, 10, 0])
        specs = list(_qwen35_tensors(vocab))
    w.add_float32(f"{arch}.rope.freq_base", 1e6)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    rng = np.random.default_rng(seed)
    write_tensors(w, specs, _quantized, lambda name, shape: _data(rng, name, shape))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="lfm2-1.2b")
    ap.add_argument("out", nargs="?", type=Path)
    a = ap.parse_args()
    print(write_hybrid_file(a.out or default_path(a.shape), shape=a.shape))
