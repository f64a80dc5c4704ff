"""Random GGUFs of 2026 families' real shapes for benchmarks/bench_families.py, written directly
as random valid quantized blocks (no quantizer run):

    python benchmarks/families_file.py [--shape gemma3n-e2b|gpt-oss-20b-experts] [OUT.gguf]

gemma3n-e2b: gemma3n at Gemma 3n E2B's shape: 30 layers (4 of every 5 sliding, window 512; the
last 10 on layers 18 / 19's K/V), width 2048, FFN 8192, 8/2 heads of 256, AltUp's 4 streams,
LAuReL rank 64, 256-wide per-layer inputs. Matrices Q4_K; the AltUp, LAuReL and per-layer
projection tensors F32, as llama-quantize leaves them.
gpt-oss-20b-experts: gpt-oss at gpt-oss-20b's shape, 4 of its 24 layers: width 2880, 64/8 heads
of 64 with sinks, windows of 128 on every other layer, 32 experts of width 2880 with 4 used,
MXFP4 experts, attention and output Q8_0 (2880 is no multiple of 256: no K-quant), router F32.
Both take SmolLM2's tokenizer (49152 tokens; the real ones have 262k and 201k). Written through
a temporary name.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from hybrid_file import BENCH_DIR
from moe_file import q4k_rows, smollm2_writer, write_typed_tensors

SHAPES = ("gemma3n-e2b", "gpt-oss-20b-experts")
Q4_K, Q8_0, MXFP4 = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q8_0, GGMLQuantizationType.MXFP4
# gemma3n-e2b
G_LAYERS, G_D, G_FF, G_HEADS, G_KV, G_HD, G_P, G_A, G_R = 30, 2048, 8192, 8, 2, 256, 256, 4, 64
# gpt-oss-20b
O_LAYERS, O_D, O_HEADS, O_KV, O_HD, O_E, O_USED = 4, 2880, 64, 8, 64, 32, 4


def default_path(shape: str) -> Path:
    return BENCH_DIR / f"{shape}-shape.gguf"


def _gemma3n(vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    q, kv = G_HEADS * G_HD, G_KV * G_HD
    yield "token_embd.weight", (vocab, G_D)
    yield "output_norm.weight", (G_D,)
    yield "per_layer_token_embd.weight", (vocab, G_LAYERS * G_P)
    yield "per_layer_model_proj.weight", (G_LAYERS * G_P, G_D)
    yield "per_layer_proj_norm.weight", (G_P,)
    yield "altup_proj.weight", (G_A - 1, G_D, G_D)
    yield "altup_unembd_proj.weight", (G_A - 1, G_D, G_D)
    for i in range(G_LAYERS):
        p = f"blk.{i}."
        for name, shape in (
                ("attn_norm", (G_D,)), ("attn_q", (q, G_D)), ("attn_k", (kv, G_D)), ("attn_v", (kv, G_D)),
                ("attn_output", (G_D, q)), ("attn_q_norm", (G_HD,)), ("attn_k_norm", (G_HD,)),
                ("post_attention_norm", (G_D,)), ("ffn_norm", (G_D,)), ("ffn_gate", (G_FF, G_D)),
                ("ffn_up", (G_FF, G_D)), ("ffn_down", (G_D, G_FF)), ("post_ffw_norm", (G_D,)),
                ("inp_gate", (G_P, G_D)), ("proj", (G_D, G_P)), ("post_norm", (G_D,)),
                ("altup_correct_coef", (G_A, G_A)), ("altup_correct_scale", (G_D,)),
                ("altup_predict_coef", (G_A * G_A, G_A)), ("altup_router", (G_A, G_D)), ("altup_router_norm", (G_D,)),
                ("laurel_l", (G_R, G_D)), ("laurel_r", (G_D, G_R)), ("laurel_post_norm", (G_D,))):
            yield p + name + ".weight", shape


def _gpt_oss(vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    q, kv = O_HEADS * O_HD, O_KV * O_HD
    yield "token_embd.weight", (vocab, O_D)
    yield "output_norm.weight", (O_D,)
    yield "output.weight", (vocab, O_D)
    for i in range(O_LAYERS):
        p = f"blk.{i}."
        for name, shape in (
                ("attn_norm.weight", (O_D,)), ("post_attention_norm.weight", (O_D,)), ("attn_q.weight", (q, O_D)),
                ("attn_k.weight", (kv, O_D)), ("attn_v.weight", (kv, O_D)), ("attn_output.weight", (O_D, q)),
                ("attn_q.bias", (q,)), ("attn_k.bias", (kv,)), ("attn_v.bias", (kv,)), ("attn_output.bias", (O_D,)),
                ("attn_sinks.weight", (O_HEADS,)), ("ffn_gate_inp.weight", (O_E, O_D)), ("ffn_gate_inp.bias", (O_E,)),
                ("ffn_gate_exps.weight", (O_E, O_D, O_D)), ("ffn_up_exps.weight", (O_E, O_D, O_D)),
                ("ffn_down_exps.weight", (O_E, O_D, O_D)), ("ffn_gate_exps.bias", (O_E, O_D)),
                ("ffn_up_exps.bias", (O_E, O_D)), ("ffn_down_exps.bias", (O_E, O_D))):
            yield p + name, shape


def _type(shape_name: str, name: str, shape: tuple[int, ...]) -> GGMLQuantizationType | None:
    if len(shape) == 1 or name.endswith(".bias") or "altup" in name or "laurel" in name or "ffn_gate_inp" in name:
        return None
    if shape_name == "gemma3n-e2b":
        return None if name == "per_layer_model_proj.weight" else Q4_K
    return MXFP4 if "_exps" in name else Q8_0


def _q8_0_rows(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    blocks = rows * cols // 32
    raw = np.empty((blocks, 34), np.uint8)
    raw[:, 0:2] = (std / 40.0 * rng.uniform(0.7, 1.3, blocks)).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    raw[:, 2:] = rng.integers(-127, 128, (blocks, 32), dtype=np.int8).view(np.uint8)
    return raw.reshape(rows, cols // 32 * 34)


def _mxfp4_rows(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """E8M0 scales near 2^-7 (weights of std ~0.03: the codes' values reach +-12)."""
    blocks = rows * cols // 32
    raw = rng.integers(0, 256, (blocks, 17), dtype=np.uint8)
    raw[:, 0] = rng.integers(119, 122, blocks)
    return raw.reshape(rows, cols // 32 * 17)


def _data(rng: np.random.Generator, shape_name: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
    qtype = _type(shape_name, name, shape)
    if qtype is None:
        if name.endswith("sinks.weight") or name.endswith(".bias"):
            return rng.normal(0.0, 0.1, shape).astype(np.float32)
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        std = 0.05 if "coef" in name else 1.0 / np.sqrt(shape[-1])
        return rng.normal(0.0, std, shape).astype(np.float32)
    rows = int(np.prod(shape[:-1]))
    std = 0.05 if "token_embd" in name else 0.02
    if qtype == Q4_K:
        raw = q4k_rows(rng, rows, shape[-1], std)
    elif qtype == Q8_0:
        raw = _q8_0_rows(rng, rows, shape[-1], std)
    else:
        raw = _mxfp4_rows(rng, rows, shape[-1])
    return raw.reshape(*shape[:-1], -1)


def write_families_file(path: Path, shape: str, seed: int = 0) -> Path:
    """Writes the file at path (through a temporary name: never half-written); returns path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    arch = "gemma3n" if shape == "gemma3n-e2b" else "gpt-oss"
    w, vocab = smollm2_writer(tmp, arch, f"random {shape}-shaped benchmark model")
    if arch == "gemma3n":
        ints = {"block_count": G_LAYERS, "embedding_length": G_D, "attention.head_count": G_HEADS,
                "attention.head_count_kv": G_KV, "attention.key_length": G_HD, "attention.value_length": G_HD,
                "feed_forward_length": G_FF, "context_length": 32768, "attention.sliding_window": 512}
        floats = {"rope.freq_base": 1e6, "rope.freq_base_swa": 1e4, "attention.layer_norm_rms_epsilon": 1e-6}
        specs = list(_gemma3n(vocab))
    else:
        ints = {"block_count": O_LAYERS, "embedding_length": O_D, "attention.head_count": O_HEADS,
                "attention.head_count_kv": O_KV, "attention.key_length": O_HD, "attention.value_length": O_HD,
                "feed_forward_length": O_D, "context_length": 131072, "attention.sliding_window": 128,
                "expert_count": O_E, "expert_used_count": O_USED, "expert_feed_forward_length": O_D,
                "rope.scaling.original_context_length": 4096}
        floats = {"rope.freq_base": 150000.0, "attention.layer_norm_rms_epsilon": 1e-5, "rope.scaling.factor": 32.0}
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        specs = list(_gpt_oss(vocab))
    for key, value in ints.items():
        w.add_uint32(f"{arch}.{key}", value)
    for key, fvalue in floats.items():
        w.add_float32(f"{arch}.{key}", fvalue)
    rng = np.random.default_rng(seed)
    write_typed_tensors(w, specs, lambda name, s: _type(shape, name, s), lambda name, s: _data(rng, shape, name, s))
    tmp.replace(path)
    return path


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default=SHAPES[0])
    ap.add_argument("out", nargs="?", type=Path)
    a = ap.parse_args()
    print(write_families_file(a.out or default_path(a.shape), a.shape))
