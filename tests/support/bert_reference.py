"""A NumPy BERT forward from a Hugging Face folder's safetensors: the reference the converted
GGUF files are compared with (llama.cpp computes their embeddings).

BertModel as transformers runs it on one sequence: word + position + token-type-0 embeddings,
LayerNorm, then post-norm encoder layers (self-attention, add, LayerNorm; GELU FFN, add,
LayerNorm); then the sentence embedding: mean or CLS pooling, L2-normalised. In float64 so the
reference itself adds no rounding worth the name. `gelu="tanh"` (the default) is the
approximation ggml computes, `gelu="erf"` transformers' exact "gelu": llama.cpp's embeddings sit
about 4x closer to the former (1 - cosine ~2e-7 against ~1e-6 on all-MiniLM-L6-v2 at F16).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


class BertReference:
    """The weights of one folder, and its forward."""

    def __init__(self, folder: Path) -> None:
        self.config = json.loads((folder / "config.json").read_text())
        raw = load_file(str(folder / "model.safetensors"))
        self.w = {k.removeprefix("bert."): v.astype(np.float64) for k, v in raw.items() if v.dtype.kind == "f"}
        self.eps = float(self.config.get("layer_norm_eps", 1e-12))

    def hidden(self, ids: list[int], gelu: str = "tanh") -> np.ndarray:
        """The last layer's hidden states, float64 [len(ids), hidden]."""
        w, c = self.w, self.config
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][: len(ids)]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self._norm(x, "embeddings.LayerNorm")
        heads = c["num_attention_heads"]
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (self._linear(x, p + f"attention.self.{n}") for n in ("query", "key", "value"))
            n, d = x.shape[0], x.shape[1] // heads
            q, k, v = (t.reshape(n, heads, d).transpose(1, 0, 2) for t in (q, k, v))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            a = (s / s.sum(axis=-1, keepdims=True)) @ v
            a = a.transpose(1, 0, 2).reshape(n, heads * d)
            x = self._norm(x + self._linear(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            f = self._linear(_gelu(self._linear(x, p + "intermediate.dense"), gelu), p + "output.dense")
            x = self._norm(x + f, p + "output.LayerNorm")
        return x

    def embed(self, ids: list[int], pooling: str = "mean", gelu: str = "tanh") -> np.ndarray:
        """The L2-normalised sentence embedding, float64 [hidden]."""
        h = self.hidden(ids, gelu)
        e = h.mean(axis=0) if pooling == "mean" else h[0]
        return e / np.linalg.norm(e)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]


def _gelu(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    from math import erf

    return 0.5 * x * (1 + np.frompyfunc(erf, 1, 1)(x / math.sqrt(2)).astype(np.float64))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
