"""A random mixture-of-experts GGUF of realistic shape for benchmarks/bench_moe.py, written
directly as random valid Q4_K blocks (quantizing random floats with NumPy would take hours):

    python benchmarks/moe_file.py [OUT.gguf]

qwen3moe, 24 layers, width 1024, 32 experts of FFN width 512 with 4 used per token, GQA 16/4
heads of 64; SmolLM2's tokenizer (49152 tokens; the real file is pulled if missing) so the
output matrix is a real model's size. Every matrix is Q4_K (router F32, as llama-quantize
leaves it); the scales are chosen so that activations stay of order one through the layers.
Tensors are generated and written one at a time (the file is ~0.8 GB; memory stays small).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from edge_infer import hub
from edge_infer.formats.gguf import GGUFFile

ARCH = "qwen3moe"
N_LAYERS, D, N_EXPERTS, N_USED, FE, N_HEADS, N_KV, HD = 24, 1024, 32, 4, 512, 16, 4, 64
DEFAULT_PATH = Path.home() / ".cache" / "edge-infer" / "bench" / "moe-qwen3moe-24x1024-e32x512-k4-q4k.gguf"
Q4_K = GGMLQuantizationType.Q4_K


def q4k_rows(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    """uint8 [rows, cols / 256 * 144]: random codes and 6-bit scales/mins; d and dmin per
    super-block so the weights have about `std` and mean near zero (mean code 7.5 * d * sc
    against dmin * m, with sc and m of equal mean)."""
    nsb = cols // 256
    raw = rng.integers(0, 256, (rows, nsb, 144), dtype=np.uint8)
    d = (std / (31.5 * 4.6) * rng.uniform(0.7, 1.3, (rows, nsb))).astype(np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(rows, nsb, 2)
    raw[:, :, 2:4] = (d.astype(np.float32) * 7.5).astype(np.float16).view(np.uint8).reshape(rows, nsb, 2)
    return raw.reshape(rows, nsb * 144)


def _tensors(vocab: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, numpy-order element shape) in file order."""
    q, kv = N_HEADS * HD, N_KV * HD
    yield "token_embd.weight", (vocab, D)
    yield "output.weight", (vocab, D)
    yield "output_norm.weight", (D,)
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        for name, shape in (("attn_norm", (D,)), ("ffn_norm", (D,)), ("attn_q_norm", (HD,)), ("attn_k_norm", (HD,)),
                            ("attn_q", (q, D)), ("attn_k", (kv, D)), ("attn_v", (kv, D)), ("attn_output", (D, q)),
                            ("ffn_gate_inp", (N_EXPERTS, D)), ("ffn_gate_exps", (N_EXPERTS, FE, D)),
                            ("ffn_up_exps", (N_EXPERTS, FE, D)), ("ffn_down_exps", (N_EXPERTS, D, FE))):
            yield p + name + ".weight", shape


def _data(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor's Q4_K bytes, or floats (norms, router)."""
    if len(shape) == 1:
        return np.ones(shape, np.float32)
    if "ffn_gate_inp" in name:
        return rng.normal(0.0, 0.05, shape).astype(np.float32)
    std = 0.5 if "token_embd" in name else 0.03
    return q4k_rows(rng, int(np.prod(shape[:-1])), shape[-1], std).reshape(*shape[:-1], -1)


def write_moe_file(path: Path, seed: int = 0) -> Path:
    """Writes the file at path (through a temporary name: never half-written); returns path."""
    tok_path = hub.resolve_model("smollm2-135m")
    with GGUFFile(tok_path) as tf:
        md = dict(tf.metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    w = GGUFWriter(str(tmp), ARCH)
    w.add_name("random qwen3moe benchmark model")
    for key, value in {"block_count": N_LAYERS, "embedding_length": D, "attention.head_count": N_HEADS,
                       "attention.head_count_kv": N_KV, "attention.key_length": HD, "attention.value_length": HD,
                       "feed_forward_length": 3072, "context_length": 4096, "expert_count": N_EXPERTS,
                       "expert_used_count": N_USED, "expert_feed_forward_length": FE}.items():
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_float32(f"{ARCH}.rope.freq_base", 1e6)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_tokenizer_pre(md.get("tokenizer.ggml.pre", "default"))
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    vocab = len(md["tokenizer.ggml.tokens"])
    specs = list(_tensors(vocab))
    for name, shape in specs:
        quant = len(shape) > 1 and "ffn_gate_inp" not in name
        row_bytes = shape[-1] // 256 * 144 if quant else shape[-1] * 4
        stored = (*shape[:-1], row_bytes) if quant else shape  # quantized: the byte shape
        w.add_tensor_info(name, stored, np.dtype(np.uint8 if quant else np.float32), int(np.prod(shape[:-1])) * row_bytes,
                          Q4_K if quant else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, shape in specs:
        w.write_tensor_data(_data(rng, name, shape))
    w.close()
    tmp.replace(path)
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH
    print(write_moe_file(out))
