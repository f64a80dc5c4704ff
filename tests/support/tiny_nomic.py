"""Tiny Hugging Face NomicBertModel folders (nomic-embed-text v1.5's config keys and tensor
names, hidden 64, 2 layers, seeded random weights, tiny_bert's WordPiece tokenizer and mean
pooling), and a NumPy forward of their weights as nomic's modeling code computes it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tiny_bert import VOCAB, write_tiny_bert


def nomic_config(**over: Any) -> dict[str, Any]:
    """nomic-embed-text-v1.5's config.json, shrunk: n_embd 64, 4 heads, n_inner 96, 2 layers, the
    vocabulary padded to a multiple of 64 (as pad_vocab_size_multiple pads the real one)."""
    c: dict[str, Any] = {
        "activation_function": "swiglu", "architectures": ["NomicBertModel"], "attn_pdrop": 0.0,
        "auto_map": {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
                     "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"},
        "bos_token_id": None, "causal": False, "dense_seq_output": True, "embd_pdrop": 0.0, "eos_token_id": None,
        "fused_bias_fc": True, "fused_dropout_add_ln": True, "initializer_range": 0.02, "layer_norm_epsilon": 1e-12,
        "max_trained_positions": 2048, "mlp_fc1_bias": False, "mlp_fc2_bias": False, "model_type": "nomic_bert",
        "n_embd": 64, "n_head": 4, "n_inner": 96, "n_layer": 2, "n_positions": 8192, "pad_vocab_size_multiple": 64,
        "parallel_block": False, "parallel_block_tied_norm": False, "prenorm": False, "qkv_proj_bias": False,
        "reorder_and_upcast_attn": False, "resid_pdrop": 0.0, "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False, "rotary_emb_scale_base": None, "rotary_scaling_factor": None,
        "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True, "summary_activation": None,
        "summary_first_dropout": 0.0, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "torch_dtype": "float32", "transformers_version": "4.34.0", "type_vocab_size": 2,
        "use_cache": True, "use_flash_attn": True, "use_rms_norm": False, "use_xentropy": True,
        "vocab_size": -(-len(VOCAB) // 64) * 64,
    }
    c.update(over)
    return c


def nomic_tensors(c: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights under NomicBertModel's names (float32): no biases but the norms'."""
    rng = np.random.default_rng(seed)
    h, f = c["n_embd"], c["n_inner"]

    def mat(*shape: int, std: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + mat(h, std=0.1), f"{name}.bias": mat(h, std=0.05)}

    t = {"embeddings.word_embeddings.weight": mat(c["vocab_size"], h, std=0.5),
         "embeddings.token_type_embeddings.weight": mat(c["type_vocab_size"], h, std=0.2), **ln("emb_ln")}
    for i in range(c["n_layer"]):
        p = f"encoder.layers.{i}."
        t[p + "attn.Wqkv.weight"] = mat(3 * h, h, std=0.25)  # sharp enough that positions matter
        t[p + "attn.out_proj.weight"] = mat(h, h)
        t[p + "mlp.fc11.weight"], t[p + "mlp.fc12.weight"] = mat(f, h), mat(f, h)
        t[p + "mlp.fc2.weight"] = mat(h, f, std=0.1)
        t.update(ln(p + "norm1"))
        t.update(ln(p + "norm2"))
    return t


def write_tiny_nomic(folder: Path, *, config: dict[str, Any] | None = None,
                     tensors: dict[str, np.ndarray] | None = None, seed: int = 0, **kw: Any) -> Path:
    """A tiny nomic-embed-text folder (tiny_bert's tokenizer files and pooling); returns it."""
    c = config or nomic_config()
    return write_tiny_bert(folder, config=c, tensors=tensors if tensors is not None else nomic_tensors(c, seed), **kw)


class NomicReference:
    """NomicBertModel's forward in float64 (post-norm blocks, NEOX-order RoPE, SwiGLU FFN)."""

    def __init__(self, folder: Path) -> None:
        self.c = json.loads((folder / "config.json").read_text())
        self.w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}

    def embed(self, ids: list[int], rope: bool = True) -> np.ndarray:
        """Mean-pooled, L2-normalised sentence embedding [n_embd] (rope=False: without positions,
        to show a test would see them missing)."""
        w, c = self.w, self.c
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0]
        x = self._ln(x, "emb_ln")
        n, heads = len(ids), c["n_head"]
        d = c["n_embd"] // heads
        inv = 1.0 / c["rotary_emb_base"] ** (np.arange(0, d, 2) / d)
        ang = np.arange(n)[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rotate(t: np.ndarray) -> np.ndarray:  # [n, heads, d]: rotate_half, halves not interleaved
            a, b = t[..., : d // 2], t[..., d // 2:]
            return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

        for i in range(c["n_layer"]):
            p = f"encoder.layers.{i}."
            qkv = x @ w[p + "attn.Wqkv.weight"].T
            q, k, v = (qkv[:, j * c["n_embd"]:(j + 1) * c["n_embd"]].reshape(n, heads, d) for j in range(3))
            if rope:
                q, k = rotate(q), rotate(k)
            s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            a = np.einsum("hqk,khd->qhd", s / s.sum(axis=-1, keepdims=True), v).reshape(n, -1)
            x = self._ln(x + a @ w[p + "attn.out_proj.weight"].T, p + "norm1")
            up, gate = x @ w[p + "mlp.fc11.weight"].T, x @ w[p + "mlp.fc12.weight"].T
            x = self._ln(x + (up * gate / (1 + np.exp(-gate))) @ w[p + "mlp.fc2.weight"].T, p + "norm2")
        e = x.mean(axis=0)
        return e / np.linalg.norm(e)

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.c["layer_norm_epsilon"]) * self.w[name + ".weight"] + self.w[name + ".bias"]
