"""Tiny Hugging Face ModernBERT folders (ModernBERT-base's config keys and tensor names, hidden
64, 3 layers with a sliding window of 8 on layers 1 and 2, seeded random weights, tiny_bpe's
byte-level BPE tokenizer, sentence-transformers mean pooling or a sequence-classification head),
and a NumPy forward of their weights as transformers' ModernBertModel computes it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file
from tiny_bpe import bpe_tokenizer, special_id


def modernbert_config(tok: dict[str, Any], **over: Any) -> dict[str, Any]:
    """ModernBERT-base's config.json, shrunk (its token ids those of `tok`)."""
    n_vocab = len(tok["model"]["vocab"]) + len([a for a in tok["added_tokens"] if a["id"] >= len(tok["model"]["vocab"])])
    c: dict[str, Any] = {
        "architectures": ["ModernBertModel"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": special_id(tok, "[CLS]"), "classifier_activation": "gelu", "classifier_bias": False,
        "classifier_dropout": 0.0, "classifier_pooling": "mean", "cls_token_id": special_id(tok, "[CLS]"),
        "decoder_bias": True, "deterministic_flash_attn": False, "embedding_dropout": 0.0,
        "eos_token_id": special_id(tok, "[SEP]"), "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
        "gradient_checkpointing": False, "hidden_activation": "gelu", "hidden_size": 64, "initializer_cutoff_factor": 2.0,
        "initializer_range": 0.02, "intermediate_size": 96, "layer_norm_eps": 1e-05, "local_attention": 8,
        "local_rope_theta": 10000.0, "max_position_embeddings": 512, "mlp_bias": False, "mlp_dropout": 0.0,
        "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05, "num_attention_heads": 4,
        "num_hidden_layers": 3, "pad_token_id": special_id(tok, "[PAD]"), "position_embedding_type": "absolute",
        "sep_token_id": special_id(tok, "[SEP]"), "sparse_pred_ignore_index": -100, "sparse_prediction": False,
        "torch_dtype": "float32", "transformers_version": "4.48.0", "vocab_size": n_vocab,
    }
    c.update(over)
    return c


def modernbert_tensors(c: dict[str, Any], seed: int = 0, prefix: str = "") -> dict[str, np.ndarray]:
    """Seeded random weights under ModernBertModel's names (float32, no biases, no attn_norm in
    layer 0), under `prefix`."""
    rng = np.random.default_rng(seed)
    h, f = c["hidden_size"], c["intermediate_size"]

    def mat(*shape: int, std: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm() -> np.ndarray:
        return 1 + mat(h, std=0.1)

    t = {"embeddings.tok_embeddings.weight": mat(c["vocab_size"], h, std=0.5), "embeddings.norm.weight": norm()}
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        if i:
            t[p + "attn_norm.weight"] = norm()
        t[p + "attn.Wqkv.weight"] = mat(3 * h, h, std=0.3)
        t[p + "attn.Wo.weight"] = mat(h, h)
        t[p + "mlp_norm.weight"] = norm()
        t[p + "mlp.Wi.weight"] = mat(2 * f, h)
        t[p + "mlp.Wo.weight"] = mat(h, f, std=0.1)
    t["final_norm.weight"] = norm()
    return {prefix + k: v for k, v in t.items()}


def write_tiny_modernbert(folder: Path, *, config: dict[str, Any] | None = None,
                          tensors: dict[str, np.ndarray] | None = None, pooling: str | None = "mean", seed: int = 0,
                          tok: dict[str, Any] | None = None) -> Path:
    """Write the folder (made if missing): config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, special_tokens_map.json, and with `pooling` sentence-transformers'
    modules.json + 1_Pooling; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    tok = tok or bpe_tokenizer()
    c = config or modernbert_config(tok)
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    save_file(tensors if tensors is not None else modernbert_tensors(c, seed), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    names = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]"}
    (folder / "special_tokens_map.json").write_text(json.dumps(names))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        **names, "clean_up_tokenization_spaces": True, "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"}))
    if pooling is not None:
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": c["hidden_size"], "pooling_mode_cls_token": pooling == "cls",
             "pooling_mode_mean_tokens": pooling == "mean"}))
    return folder


def classifier_folder(folder: Path, labels: dict[str, str], seed: int = 0) -> Path:
    """A ModernBertForSequenceClassification folder: "model."-prefixed weights, the head's dense
    layer and norm, a classifier with one row per label; no sentence-transformers pooling."""
    tok = bpe_tokenizer()
    c = modernbert_config(tok, architectures=["ModernBertForSequenceClassification"], id2label=labels,
                          label2id={v: int(k) for k, v in labels.items()})
    t = modernbert_tensors(c, seed, prefix="model.")
    rng = np.random.default_rng(seed + 7)
    h = c["hidden_size"]
    t["head.dense.weight"] = (rng.standard_normal((h, h)) * 0.2).astype(np.float32)
    t["head.norm.weight"] = (1 + rng.standard_normal(h) * 0.1).astype(np.float32)
    t["classifier.weight"] = (rng.standard_normal((len(labels), h)) * 0.3).astype(np.float32)
    t["classifier.bias"] = (rng.standard_normal(len(labels)) * 0.1).astype(np.float32)
    return write_tiny_modernbert(folder, config=c, tensors=t, pooling=None, tok=tok)


class ModernBertReference:
    """ModernBertModel's forward in float64: pre-norm blocks with bias-free LayerNorms, NEOX-order
    RoPE (global or local base), a symmetric window on local layers, GeGLU (the tanh GELU, as
    ggml computes it), a final norm; mean pooling; the classification head."""

    def __init__(self, folder: Path) -> None:
        self.c = json.loads((folder / "config.json").read_text())
        raw = load_file(str(folder / "model.safetensors"))
        self.w = {k.removeprefix("model."): v.astype(np.float64) for k, v in raw.items()}

    def hidden(self, ids: list[int], window: bool = True) -> np.ndarray:
        """The final norm's output [len(ids), hidden] (window=False: every layer global)."""
        w, c = self.w, self.c
        x = self._ln(w["embeddings.tok_embeddings.weight"][ids], "embeddings.norm")
        n, heads, h = len(ids), c["num_attention_heads"], c["hidden_size"]
        d = h // heads
        dist = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
        for i in range(c["num_hidden_layers"]):
            p = f"layers.{i}."
            local = i % c["global_attn_every_n_layers"] != 0
            a = self._ln(x, p + "attn_norm") if p + "attn_norm.weight" in w else x
            q, k, v = (t.reshape(n, heads, d) for t in np.split(a @ w[p + "attn.Wqkv.weight"].T, 3, axis=1))
            base = c["local_rope_theta"] if local else c["global_rope_theta"]
            q, k = _rope(q, base), _rope(k, base)
            s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
            if local and window:
                s = np.where(dist[None] <= c["local_attention"] // 2, s, -np.inf)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            att = np.einsum("hqk,khd->qhd", s / s.sum(axis=-1, keepdims=True), v).reshape(n, h)
            x = x + att @ w[p + "attn.Wo.weight"].T
            up, gate = np.split(self._ln(x, p + "mlp_norm") @ w[p + "mlp.Wi.weight"].T, 2, axis=1)
            x = x + (_gelu(up) * gate) @ w[p + "mlp.Wo.weight"].T
        return self._ln(x, "final_norm")

    def embed(self, ids: list[int], window: bool = True) -> np.ndarray:
        e = self.hidden(ids, window).mean(axis=0)
        return e / np.linalg.norm(e)

    def scores(self, ids: list[int]) -> np.ndarray:
        """The classifier's outputs: mean pooling, head (dense, GELU, norm), classifier."""
        w = self.w
        pooled = self.hidden(ids).mean(axis=0)
        y = self._ln(_gelu(pooled @ w["head.dense.weight"].T), "head.norm")
        return y @ w["classifier.weight"].T + w["classifier.bias"]

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.c["norm_eps"]) * self.w[name + ".weight"]


def _rope(t: np.ndarray, base: float) -> np.ndarray:
    """t [n, heads, d] rotated by position, rotate_half style (halves, not interleaved pairs)."""
    n, _, d = t.shape
    ang = np.arange(n)[:, None] * (1.0 / base ** (np.arange(0, d, 2) / d))[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = t[..., : d // 2], t[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
