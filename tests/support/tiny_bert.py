"""Tiny Hugging Face BERT folders with seeded random weights, written the way transformers and
sentence-transformers save them: config.json, model.safetensors (safetensors.numpy), a
WordPiece tokenizer.json (built with `tokenizers`), vocab.txt, tokenizer_config.json and
special_tokens_map.json, and sentence-transformers' modules.json + 1_Pooling/config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an is was are be to of and in on at it this that with for as by from not but or "
    "cat dog bird fish man woman child house tree car road sun moon star sky water fire city "
    "sat ran play jump walk talk sing read write eat look see go come make take give "
    "red blue green big small old new good bad happy quiet fast slow "
    "hello world test guitar stage crowd music morning night today "
    ". , ! ? ' - ( ) 1 2 3"
).split()
PIECES = ["##s", "##ing", "##ed", "##er", "##ly", "##es", "##y", "##n", "##t", "##a", "##e"]
VOCAB = SPECIALS + WORDS + PIECES
SENTENCES = (
    "Hello world! This is a test.",
    "The cat sat on the mat.",  # "mat" is no token: [UNK]
    "A dog runs fast in the morning, and the birds sing.",
    "The old man walked to the city with his dog?",
    "Happy children play music on the stage tonight",
    "(1) big red cars; 2 small blue trees - 3 quiet stars",
)


def vocab_txt() -> str:
    return "".join(t + "\n" for t in VOCAB)


def bert_config(**over: Any) -> dict[str, Any]:
    """config.json of the tiny BERT: hidden 64, 2 layers, 4 heads, FFN 128, 64 positions."""
    c: dict[str, Any] = {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": len(VOCAB), "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "hidden_act": "gelu",
        "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    }
    c.update(over)
    return c


def bert_tensors(c: dict[str, Any], seed: int = 0, prefix: str = "") -> dict[str, np.ndarray]:
    """Seeded random weights in BertModel's names and shapes (float32), under `prefix`."""
    rng = np.random.default_rng(seed)
    h, f = c["hidden_size"], c["intermediate_size"]

    def mat(*shape: int, std: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": 1 + mat(h, std=0.1), f"{name}.bias": mat(h, std=0.05)}

    t = {
        "embeddings.word_embeddings.weight": mat(c["vocab_size"], h, std=0.5),
        "embeddings.position_embeddings.weight": mat(c["max_position_embeddings"], h, std=0.2),
        "embeddings.token_type_embeddings.weight": mat(c["type_vocab_size"], h, std=0.2),
        "embeddings.position_ids": np.arange(c["max_position_embeddings"], dtype=np.int64)[None],
        **ln("embeddings.LayerNorm"),
    }
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + n + ".weight"], t[p + n + ".bias"] = mat(h, h), mat(h, std=0.05)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = mat(f, h), mat(f, std=0.05)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = mat(h, f, std=0.1), mat(h, std=0.05)
        t.update(ln(p + "attention.output.LayerNorm"))
        t.update(ln(p + "output.LayerNorm"))
    t["pooler.dense.weight"], t["pooler.dense.bias"] = mat(h, h), mat(h, std=0.05)
    return {prefix + k: v for k, v in t.items()}


def tokenizer_json() -> str:
    """A BertTokenizerFast-style tokenizer.json over VOCAB (lowercasing, accents stripped)."""
    from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = {t: i for i, t in enumerate(VOCAB)}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in SPECIALS])
    return tok.to_str()


def write_tiny_bert(folder: Path, *, config: dict[str, Any] | None = None, tensors: dict[str, np.ndarray] | None = None,
                    pooling: str | None = "mean", tokenizer: bool = True, seed: int = 0) -> Path:
    """Write a tiny BERT folder (made if missing); returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    c = config or bert_config()
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    save_file(tensors if tensors is not None else bert_tensors(c, seed), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "vocab.txt").write_text(vocab_txt())
    names = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
             "mask_token": "[MASK]"}
    (folder / "special_tokens_map.json").write_text(json.dumps(names))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, **names, "tokenize_chinese_chars": True, "strip_accents": None,
         "tokenizer_class": "BertTokenizer", "model_max_length": 64}))
    if tokenizer:
        (folder / "tokenizer.json").write_text(tokenizer_json())
    if pooling is not None:
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
        (folder / "1_Pooling").mkdir(exist_ok=True)
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": c.get("hidden_size", c.get("n_embd")), "pooling_mode_cls_token": pooling == "cls",
             "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
             "pooling_mode_mean_sqrt_len_tokens": False}))
    return folder


def classifier_folder(folder: Path, labels: dict[str, str]) -> Path:
    """A BertForSequenceClassification folder: "bert."-prefixed weights with the pooler, and a
    classifier with one row per label."""
    c = bert_config(architectures=["BertForSequenceClassification"], id2label=labels,
                    label2id={v: int(k) for k, v in labels.items()})
    t = bert_tensors(c, prefix="bert.")
    rng = np.random.default_rng(7)
    t["classifier.weight"] = (rng.standard_normal((len(labels), c["hidden_size"])) * 0.2).astype(np.float32)
    t["classifier.bias"] = (rng.standard_normal(len(labels)) * 0.1).astype(np.float32)
    return write_tiny_bert(folder, config=c, tensors=t, pooling=None)
