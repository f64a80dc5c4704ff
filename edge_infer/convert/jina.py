"""jina-bert-v2 (JinaBertModel, JinaBertForMaskedLM: jina-embeddings-v2) as llama.cpp's
JinaBertV2Model converts it: config.json with BertConfig's defaults (its model type is "bert",
so AutoConfig reads it without remote code) and ALiBi positions, the tensors under gguf-py's
JINA_BERT_V2 names (separate Q/K/V with biases, jina-v2-code's Q/K LayerNorms and second norm,
a fused GeGLU up matrix or up and gate apart), and the vocabulary tokenizer_config.json's
tokenizer_class names: BertTokenizer's WordPiece (as BERT's), or RobertaTokenizer's byte-level
BPE ("gpt2", two token types).

Refused: a BPE tokenizer whose pre-tokenizer hash llama.cpp does not know (it refuses it too:
the hash says which of jina's splitting rules applies), the whitespace pre-tokenizer (its
"whitespace" vocabulary is one edge-infer does not read), a classifier with labels (llama.cpp's
jina-bert-v2 has no cls.output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFWriter, LlamaFileType

from edge_infer.convert.bert import add_wordpiece_vocab, bert_config
from edge_infer.convert.hf_folder import SafetensorParts, classifier_labels, classifier_pooling, pooling_type
from edge_infer.convert.model_base import (
    Converter,
    Planned,
    Shapes,
    bert_family_gguf_name,
    check_tensors,
    hf_name_of,
    planned,
)
from edge_infer.convert.special_vocab import read_json, read_specials
from edge_infer.convert.text_params import add_bert_parameters, add_text_parameters
from edge_infer.convert.vocab import read_vocab
from edge_infer.errors import ConversionError

# gguf-py's tensor map for MODEL_ARCH.JINA_BERT_V2, as far as jina's checkpoints name them
WHOLE = {"embeddings.word_embeddings": "token_embd", "embeddings.token_type_embeddings": "token_types",
         "embeddings.LayerNorm": "token_embd_norm", "classifier": "cls"}
LAYER_PREFIX = "encoder.layer."
LAYER = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k", "attention.self.value": "attn_v",
    "attention.self.layer_norm_q": "attn_q_norm", "attention.self.layer_norm_k": "attn_k_norm",
    "attention.output.dense": "attn_output", "attention.output.LayerNorm": "attn_output_norm",
    "layer_norm_1": "attn_norm_2", "mlp.gated_layers": "ffn_up", "mlp.gated_layers_v": "ffn_up",
    "mlp.gated_layers_w": "ffn_gate", "mlp.up_gated_layer": "ffn_up", "mlp.wo": "ffn_down",
    "mlp.down_layer": "ffn_down", "mlp.layernorm": "layer_output_norm", "layer_norm_2": "layer_output_norm",
}
NORM_PAIRS = ("attn_output_norm", "layer_output_norm", "attn_q_norm", "attn_k_norm", "attn_norm_2")


def gguf_name(hf: str) -> str | None:
    """The GGUF name llama.cpp gives the Hugging Face tensor `hf`, or None when it drops it."""
    return bert_family_gguf_name(hf, WHOLE, LAYER_PREFIX, LAYER, "jina-bert-v2")


def layer_shapes(found: dict[str, tuple[str, tuple[int, ...]]], i: int, h: int, ff: int) -> Shapes:
    """Layer i's tensors and shapes; the FFN's form (fused GeGLU up, or up and gate) as found."""
    p = f"blk.{i}."
    s: Shapes = {p + "attn_output.weight": (h, h), p + "attn_output.bias": (h,),
                 p + "ffn_down.weight": (h, ff), p + "ffn_down.bias": (h,)}
    for x in "qkv":
        s[p + f"attn_{x}.weight"], s[p + f"attn_{x}.bias"] = (h, h), (h,)
    for norm in NORM_PAIRS:
        s[p + f"{norm}.weight"], s[p + f"{norm}.bias"] = (h,), (h,)
    up = ff if p + "ffn_gate.weight" in found else 2 * ff
    s[p + "ffn_up.weight"], s[p + "ffn_up.bias"] = (up, h), (up,)
    if up == ff:
        s[p + "ffn_gate.weight"] = (ff, h)
    return s


OPTIONAL_IN_LAYER = ("attn_q.bias", "attn_k.bias", "attn_v.bias", "ffn_up.bias", "attn_q_norm.weight",
                     "attn_q_norm.bias", "attn_k_norm.weight", "attn_k_norm.bias", "attn_norm_2.weight",
                     "attn_norm_2.bias")


class JinaBertConverter(Converter):
    """JinaBertModel, JinaBertForMaskedLM -> `jina-bert-v2`."""

    arch = "jina-bert-v2"
    hf_architectures = ("JinaBertModel", "JinaBertForMaskedLM")

    @classmethod
    def from_config(cls, path: Path, raw: dict[str, Any], arch: str) -> JinaBertConverter:
        return cls(bert_config(path, raw, arch, positions="alibi"))

    def prepare(self) -> None:
        f = self.folder
        conf_path = f.path / "tokenizer_config.json"
        conf = read_json(conf_path) if conf_path.is_file() else None
        self.tokenizer_class = conf.get("tokenizer_class") if isinstance(conf, dict) else None
        if self.tokenizer_class not in ("BertTokenizer", "RobertaTokenizer"):
            raise ConversionError(f"{conf_path}: tokenizer_class {self.tokenizer_class!r} is not supported for jina-bert-v2 "
                                  "(llama.cpp's converter reads BertTokenizer or RobertaTokenizer)")
        self.labels = classifier_labels(f)
        if self.labels:
            raise ConversionError(f"{f.config_path}: classifier labels {self.labels} are not supported; llama.cpp's "
                                  "jina-bert-v2 has no classifier output")
        if self.tokenizer_class == "BertTokenizer":
            self.vocab = read_vocab(f.path, f.int("vocab_size"), "WordPiece", self.arch)
            self.specials = read_specials(f.path, len(self.vocab.tokens))
        else:
            tok = read_json(f.path / "tokenizer.json") if (f.path / "tokenizer.json").is_file() else {}
            if isinstance(tok, dict) and isinstance(tok.get("pre_tokenizer"), dict) and \
                    tok["pre_tokenizer"].get("type") == "Whitespace":
                raise ConversionError(f"{f.path / 'tokenizer.json'}: a Whitespace pre-tokenizer (llama.cpp's "
                                      "\"whitespace\" vocabulary) is not supported")
            self.vocab = read_vocab(f.path, f.int("vocab_size"), "BPE", self.arch, fallback_pre=None)
            self.specials = read_specials(f.path, None, load_merges=True)
        self.pooling = pooling_type(f), classifier_pooling(f)

    def plan(self, parts: SafetensorParts) -> list[Planned]:
        found = {name: (hf, parts.shape(hf)) for hf in parts.names() if (name := gguf_name(hf)) is not None}
        f = self.folder
        h, ff, layers = f.int("hidden_size"), f.int("intermediate_size"), f.int("num_hidden_layers")
        want: Shapes = {"token_embd.weight": (f.int("vocab_size"), h), "token_types.weight": (f.int("type_vocab_size"), h),
                        "token_embd_norm.weight": (h,), "token_embd_norm.bias": (h,), "cls.weight": (1, h),
                        "cls.bias": (1,)}
        optional = ["cls.weight", "cls.bias"]
        for i in range(layers):
            want |= layer_shapes(found, i, h, ff)
            optional += [f"blk.{i}.{n}" for n in OPTIONAL_IN_LAYER]

        def why(name: str) -> str:
            if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
                return f"it is beyond the {layers} layers of num_hidden_layers"
            return "llama.cpp's jina-bert-v2 has no such tensor"

        pairs = tuple(f"blk.{i}.{n}" for i in range(layers) for n in NORM_PAIRS)
        check_tensors(found, want, tuple(optional), why, lambda n: hf_name_of(n, WHOLE, LAYER_PREFIX, LAYER),
                      pairs=pairs + ("cls",))
        return planned(parts, found)

    def add_parameters(self, w: GGUFWriter, ftype: LlamaFileType) -> None:
        add_text_parameters(w, self.folder.config, ftype)
        add_bert_parameters(w, self.arch, self.pooling, self.labels)

    def add_vocab(self, w: GGUFWriter) -> None:
        if self.tokenizer_class == "BertTokenizer":
            add_wordpiece_vocab(w, self.folder.int("type_vocab_size"), self.vocab, self.specials)
            return
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(self.vocab.pre)
        w.add_token_list(self.vocab.tokens)
        w.add_token_types(self.vocab.types)
        self.specials.write(w)
        w.add_token_type_count(2)
