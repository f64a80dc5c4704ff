"""Tiny Hugging Face jina-embeddings-v2 folders (JinaBertModel's config keys and tensor names:
ALiBi instead of positions, a fused GeGLU MLP; hidden 64, 2 layers, seeded random weights,
tiny_bert's WordPiece tokenizer or tiny_bpe's RoBERTa-style BPE one under RobertaTokenizer,
mean pooling), and
a NumPy forward of their weights as jina's modeling code computes it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tiny_bert import VOCAB, write_tiny_bert
from tiny_bpe import bpe_tokenizer


def jina_config(**over: Any) -> dict[str, Any]:
    """jina-embeddings-v2-base-en's config.json, shrunk."""
    c: dict[str, Any] = {
        "architectures": ["JinaBertModel"], "attention_probs_dropout_prob": 0.0, "attn_implementation": "torch",
        "auto_map": {"AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
                     "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel"},
        "classifier_dropout": None, "emb_pooler": "mean", "feed_forward_type": "geglu", "gradient_checkpointing": False,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 96, "layer_norm_eps": 1e-12, "max_position_embeddings": 8192, "model_max_length": 8192,
        "model_type": "bert", "num_attention_heads": 4, "num_hidden_layers": 2, "pad_token_id": 0,
        "position_embedding_type": "alibi", "torch_dtype": "float32", "transformers_version": "4.26.0",
        "type_vocab_size": 2, "use_cache": True, "vocab_size": len(VOCAB),
    }
    c.update(over)
    return c


def jina_tensors(c: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights under JinaBertModel's names (float32)."""
    rng = np.random.default_rng(seed)
    h, f = c["hidden_size"], c["intermediate_size"]

    def mat(*shape: int, std: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + mat(h, std=0.1), f"{name}.bias": mat(h, std=0.05)}

    t = {"embeddings.word_embeddings.weight": mat(c["vocab_size"], h, std=0.5),
         "embeddings.token_type_embeddings.weight": mat(c["type_vocab_size"], h, std=0.2), **ln("embeddings.LayerNorm")}
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            t[p + f"attention.self.{n}.weight"] = mat(h, h, std=0.3 if n != "value" else 0.15)
            t[p + f"attention.self.{n}.bias"] = mat(h, std=0.05)
        t[p + "attention.output.dense.weight"], t[p + "attention.output.dense.bias"] = mat(h, h), mat(h, std=0.05)
        t.update(ln(p + "attention.output.LayerNorm"))
        t[p + "mlp.gated_layers.weight"] = mat(2 * f, h)
        t[p + "mlp.wo.weight"], t[p + "mlp.wo.bias"] = mat(h, f, std=0.1), mat(h, std=0.05)
        t.update(ln(p + "mlp.layernorm"))
    t["pooler.dense.weight"], t["pooler.dense.bias"] = mat(h, h), mat(h, std=0.05)
    return t


def write_tiny_jina(folder: Path, *, config: dict[str, Any] | None = None, tensors: dict[str, np.ndarray] | None = None,
                    bpe: bool = False, seed: int = 0) -> Path:
    """A tiny jina-embeddings-v2 folder: tiny_bert's WordPiece files, or with bpe a byte-level
    BPE tokenizer.json under tokenizer_class RobertaTokenizer (vocab_size its size)."""
    tok = bpe_tokenizer(roberta=True, extra=()) if bpe else None
    c = config or jina_config(**({"vocab_size": 400, "pad_token_id": 1} if bpe else {}))
    write_tiny_bert(folder, config=c, tensors=tensors if tensors is not None else jina_tensors(c, seed))
    if tok is not None:
        (folder / "vocab.txt").unlink()
        (folder / "tokenizer.json").write_text(json.dumps(tok))
        names = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
                 "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}
        (folder / "special_tokens_map.json").write_text(json.dumps(names))
        (folder / "tokenizer_config.json").write_text(json.dumps({**names, "tokenizer_class": "RobertaTokenizer",
                                                                  "model_max_length": 8192}))
    return folder


class JinaReference:
    """JinaBertModel's forward in float64: post-norm blocks, symmetric ALiBi (-|i - j| times each
    head's slope), a GeGLU MLP (the tanh GELU of the first half times the second)."""

    def __init__(self, folder: Path) -> None:
        self.c = json.loads((folder / "config.json").read_text())
        self.w = {k.removeprefix("bert."): v.astype(np.float64)
                  for k, v in load_file(str(folder / "model.safetensors")).items()}

    def embed(self, ids: list[int], alibi: bool = True) -> np.ndarray:
        """Mean-pooled, L2-normalised sentence embedding (alibi=False: without positions)."""
        w, c = self.w, self.c
        x = self._ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0],
                     "embeddings.LayerNorm")
        n, heads, h, f = len(ids), c["num_attention_heads"], c["hidden_size"], c["intermediate_size"]
        d = h // heads
        slopes = 2.0 ** (-8.0 / heads * np.arange(1, heads + 1))
        bias = -np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])[None] * slopes[:, None, None]
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (self._linear(x, p + f"attention.self.{m}").reshape(n, heads, d) for m in ("query", "key", "value"))
            s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + (bias if alibi else 0.0)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            a = np.einsum("hqk,khd->qhd", s / s.sum(axis=-1, keepdims=True), v).reshape(n, h)
            x = self._ln(x + self._linear(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            g = x @ w[p + "mlp.gated_layers.weight"].T
            y = _gelu(g[:, :f]) * g[:, f:]
            x = self._ln(x + self._linear(y, p + "mlp.wo"), p + "mlp.layernorm")
        e = x.mean(axis=0)
        return e / np.linalg.norm(e)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.c["layer_norm_eps"]) * self.w[name + ".weight"] + self.w[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
