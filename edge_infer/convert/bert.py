"""BERT (BertModel, BertForMaskedLM, BertForSequenceClassification) as llama.cpp's BertModel
converts it: config.json with transformers' BertConfig defaults, the tensors of bert_map, the
TextModel and BertModel hyper-parameters, the WordPiece vocabulary (BertModel.set_vocab, which
nomic-bert and jina-bert-v2 share)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFWriter, LlamaFileType

from edge_infer.convert import bert_map
from edge_infer.convert.hf_folder import (
    HFFolder,
    SafetensorParts,
    check_heads,
    check_number,
    check_sizes,
    classifier_labels,
    classifier_pooling,
    pooling_type,
)
from edge_infer.convert.model_base import Converter, Planned, planned
from edge_infer.convert.special_vocab import Specials, read_specials
from edge_infer.convert.text_params import add_bert_parameters, add_text_parameters
from edge_infer.convert.vocab import Vocab, read_vocab
from edge_infer.errors import ConversionError

# transformers' BertConfig defaults: AutoConfig fills them in, so llama.cpp's converter sees them
BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
    "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0, "position_embedding_type": "absolute",
}
INT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")
# llama.cpp's bert graph always computes GELU: another activation would load and compute wrongly
GELU_NAMES = ("gelu", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")


def bert_config(path: Path, raw: dict[str, Any], arch: str, positions: str = "absolute") -> HFFolder:
    """config.json with BertConfig's defaults, checked: positive sizes, GELU, the positions
    llama.cpp's graph computes (`positions`: BERT's learned ones; jina-bert-v2's ALiBi)."""
    config = {**BERT_DEFAULTS, **raw}
    check_sizes(path / "config.json", config, INT_FIELDS)
    check_heads(path / "config.json", config["hidden_size"], config["num_attention_heads"], "hidden_size",
                "num_attention_heads")
    if config["hidden_act"] not in GELU_NAMES:
        raise ConversionError(f"{path / 'config.json'}: hidden_act {config['hidden_act']!r} is not supported; "
                              "llama.cpp's bert computes GELU")
    if config["position_embedding_type"] != positions:
        what = "learned absolute positions" if positions == "absolute" else f"{positions} positions"
        raise ConversionError(f"{path / 'config.json'}: position_embedding_type {config['position_embedding_type']!r} "
                              f"is not supported; llama.cpp's {'bert' if positions == 'absolute' else 'model'} has {what}")
    check_number(path / "config.json", config, "layer_norm_eps")
    return HFFolder(path, config, arch)


def add_wordpiece_vocab(w: GGUFWriter, type_count: int, vocab: Vocab, specials: Specials) -> None:
    """BertModel.set_vocab: token types, the WordPiece vocabulary, the special tokens."""
    w.add_token_type_count(type_count)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    specials.write(w)


class BertConverter(Converter):
    """BertModel, BertForMaskedLM, BertForSequenceClassification -> `bert`."""

    arch = "bert"
    hf_architectures = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")

    @classmethod
    def from_config(cls, path: Path, raw: dict[str, Any], arch: str) -> BertConverter:
        return cls(bert_config(path, raw, arch))

    def prepare(self) -> None:
        f = self.folder
        self.labels = classifier_labels(f)
        self.vocab = read_vocab(f.path, f.int("vocab_size"))
        self.specials = read_specials(f.path, len(self.vocab.tokens))
        self.pooling = pooling_type(f), classifier_pooling(f)

    def plan(self, parts: SafetensorParts) -> list[Planned]:
        """Every kept tensor, checked (names and shapes from the headers, before any data is read)."""
        found: dict[str, tuple[str, tuple[int, ...]]] = {}
        for hf in parts.names():
            name = bert_map.gguf_name(hf, self.labels is not None)
            if name is not None:
                found[name] = (hf, parts.shape(hf))
        f = self.folder
        bert_map.check_tensors(found, bert_map.BertDims(
            vocab=f.int("vocab_size"), hidden=f.int("hidden_size"), layers=f.int("num_hidden_layers"),
            ffn=f.int("intermediate_size"), positions=f.int("max_position_embeddings"),
            token_types=f.int("type_vocab_size"), labels=len(self.labels or ())))
        return planned(parts, found)

    def add_parameters(self, w: GGUFWriter, ftype: LlamaFileType) -> None:
        add_text_parameters(w, self.folder.config, ftype)
        add_bert_parameters(w, self.arch, self.pooling, self.labels)

    def add_vocab(self, w: GGUFWriter) -> None:
        add_wordpiece_vocab(w, self.folder.int("type_vocab_size"), self.vocab, self.specials)
