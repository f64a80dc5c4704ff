"""Random-weight LoRA adapters in llama.cpp's layout (convert_lora_to_gguf.py's): general.type
adapter, adapter.type lora, adapter.lora.alpha, and per target matrix `<name>.lora_a` [rank, in]
/ `.lora_b` [out, rank] (numpy order), for a real base model's tensors."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from edge_infer.formats.gguf import GGUFFile

# the matrices PEFT's LoRA usually targets: attention and MLP
ALL_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_lora(path: Path, base: Path, *, rank: int = 8, alpha: float = 16.0, targets: tuple[str, ...] = ALL_TARGETS,
               layers: list[int] | None = None, strength: float = 1.0, seed: int = 0, dtype: str = "F32",
               arch: str | None = None, extra: dict[str, tuple[tuple[int, ...], float]] | None = None) -> Path:
    """An adapter for `base`'s tensors blk.{i}.{target}.weight (every layer, or `layers`). The
    update is scaled so that llama.cpp's alpha / rank (1 for alpha 0) times it has the same size
    for any rank (strength 0.2 moves smollm2's logits by a KL of about 0.4); dtype F32, F16 or Q8_0 (rank-wide B stays F16
    then: Q8_0 needs rows of 32). extra: more tensors by name -> (numpy shape, standard
    deviation), F32."""
    rng = np.random.default_rng(seed)
    with GGUFFile(base) as f:
        shapes = {n: t.numpy_shape for n, t in f.tensors.items()}
        arch = arch or f.architecture
        n_layers = 1 + max(int(n.split(".")[1]) for n in shapes if n.startswith("blk."))
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for i in layers if layers is not None else range(n_layers):
        for t in targets:
            name = f"blk.{i}.{t}.weight"
            if name not in shapes:
                continue
            out_dim, in_dim = shapes[name]
            a = (rng.standard_normal((rank, in_dim)) / np.sqrt(in_dim)).astype(np.float32)
            b = (rng.standard_normal((out_dim, rank)) * (strength * 0.6 * rank / (alpha or rank))).astype(np.float32)
            _add(w, name + ".lora_a", a, dtype)
            _add(w, name + ".lora_b", b, dtype if dtype != "Q8_0" or rank % 32 == 0 else "F16")
    for name, (shape, std) in (extra or {}).items():
        _add(w, name, (rng.standard_normal(shape) * std).astype(np.float32), "F32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add(w: gguf.GGUFWriter, name: str, x: np.ndarray, dtype: str) -> None:
    if dtype == "F32":
        w.add_tensor(name, x)
    elif dtype == "F16":
        w.add_tensor(name, x.astype(np.float16))
    else:
        q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
