"""modern-bert (ModernBertModel, ModernBertForSequenceClassification) as llama.cpp's
ModernBertModel converts it: config.json with transformers' ModernBertConfig defaults (4.57,
the converter's pin), the tensors under gguf-py's MODERN_BERT names ("model." dropped), the
sliding window and its pattern, both rope bases, the FFN's activation, the classifier's pooling,
and a byte-level BPE vocabulary with its merges ("gpt2").

The pre-tokenizer is named by llama.cpp's hash table; a tokenizer it does not know (llama.cpp
refuses one) gets "modern-bert", ModernBERT's own, with a log line. Refused: biases in norms,
attention or FFN (llama.cpp's graph has none), a rank head with another activation than GELU,
no layer_norm_eps (llama.cpp's modern-bert cannot load without it), RoPE scaling.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gguf import GGUFWriter, LlamaFileType, RopeScalingType

from edge_infer.convert.hf_folder import (
    HFFolder,
    SafetensorParts,
    check_heads,
    check_sizes,
    classifier_labels,
    classifier_pooling,
    pooling_type,
)
from edge_infer.convert.model_base import (
    DROPPED,
    DROPPED_PREFIXES,
    DROPPED_SUFFIXES,
    Converter,
    Planned,
    check_tensors,
    hf_name_of,
    layer_shapes,
    map_name,
    planned,
)
from edge_infer.convert.special_vocab import read_specials
from edge_infer.convert.text_params import add_bert_parameters, add_text_parameters, check_plain_rope, find
from edge_infer.convert.vocab import read_vocab
from edge_infer.errors import ConversionError

# transformers 4.57's ModernBertConfig defaults that the converter reads (AutoConfig fills them in)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
    "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-5,
    "norm_bias": False, "global_rope_theta": 160000.0, "attention_bias": False, "global_attn_every_n_layers": 3,
    "local_attention": 128, "local_rope_theta": 10000.0, "mlp_bias": False, "classifier_pooling": "cls",
    "classifier_bias": False, "classifier_activation": "gelu",
}
INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings", "global_attn_every_n_layers", "local_attention")
# hidden_activation values llama.cpp maps to its FFN (gelu variants fall back to its GeGLU, rightly)
ACTIVATIONS = ("gelu", "geglu", "silu", "swish", "swiglu", "relu", "reglu", "gelu_new", "gelu_python",
               "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate")
NO_BIAS = ("norm_bias", "attention_bias", "mlp_bias")
PRE = "modern-bert"  # llama.cpp's name for ModernBERT's pre-tokenizer
# gguf-py's tensor map for MODEL_ARCH.MODERN_BERT, spelled out (names without "model.")
WHOLE = {"embeddings.tok_embeddings": "token_embd", "embeddings.norm": "token_embd_norm", "final_norm": "output_norm",
         "head.dense": "cls", "head.norm": "cls.norm", "classifier.out_proj": "cls.output", "classifier": "cls"}
LAYER_PREFIX = "layers."
LAYER = {"attn_norm": "attn_norm", "attn.Wqkv": "attn_qkv", "attn.Wo": "attn_output", "mlp_norm": "ffn_norm",
         "mlp.Wi": "ffn_up", "mlp.Wo": "ffn_down"}
OPTIONAL = ("blk.0.attn_norm.weight", "cls.weight", "cls.norm.weight", "cls.output.weight", "cls.output.bias")


def gguf_name(hf: str, has_labels: bool) -> str | None:
    """The GGUF name llama.cpp gives the Hugging Face tensor `hf`, or None when it drops it.
    has_labels: real classifier labels (the classifier becomes cls.output)."""
    name = hf[6:] if hf.startswith("model.") else hf
    if name in DROPPED or name.startswith(DROPPED_PREFIXES) or name.endswith(DROPPED_SUFFIXES):
        return None
    if has_labels and name in ("classifier.weight", "classifier.bias"):
        name = "classifier.out_proj." + name.rsplit(".", 1)[1]
    mapped = map_name(name, WHOLE, LAYER_PREFIX, LAYER)
    if mapped is None:
        why = " (a masked-LM decoder: convert the model without its head)" if name.startswith("decoder.") else ""
        raise ConversionError(f"tensor {hf!r} is not one of modern-bert's tensors{why}")
    return mapped


def modernbert_config(path: Path, raw: dict[str, Any], arch: str) -> HFFolder:
    """config.json with ModernBertConfig's defaults, checked for what llama.cpp's modern-bert computes."""
    conf, c = path / "config.json", {**DEFAULTS, **raw}
    check_sizes(conf, c, INT_FIELDS)
    check_heads(conf, c["hidden_size"], c["num_attention_heads"], "hidden_size", "num_attention_heads")
    for key in NO_BIAS:
        if c[key]:
            raise ConversionError(f"{conf}: {key} true is not supported; llama.cpp's modern-bert has no such biases")
    if c["hidden_activation"] not in ACTIVATIONS:
        raise ConversionError(f"{conf}: hidden_activation {c['hidden_activation']!r} is not supported "
                              f"({', '.join(ACTIVATIONS)})")
    if arch.endswith("ForSequenceClassification") and c["classifier_activation"] not in ACTIVATIONS[:2]:
        raise ConversionError(f"{conf}: classifier_activation {c['classifier_activation']!r} is not supported; "
                              "llama.cpp's modern-bert classifier head computes GELU")
    if find(c, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")) is None:
        raise ConversionError(f"{conf}: no layer_norm_eps: llama.cpp's converter writes the LayerNorm epsilon "
                              "from it (norm_eps alone goes to the RMS key, which modern-bert does not read)")
    check_plain_rope(conf, c)
    return HFFolder(path, c, arch)


class ModernBertConverter(Converter):
    """ModernBertModel, ModernBertForMaskedLM (without its decoder), ModernBertForSequenceClassification
    -> `modern-bert`."""

    arch = "modern-bert"
    hf_architectures = ("ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification")

    @classmethod
    def from_config(cls, path: Path, raw: dict[str, Any], arch: str) -> ModernBertConverter:
        return cls(modernbert_config(path, raw, arch))

    def prepare(self) -> None:
        f = self.folder
        self.labels = classifier_labels(f)
        self.vocab = read_vocab(f.path, f.int("vocab_size"), "BPE", self.arch, fallback_pre=PRE)
        self.specials = read_specials(f.path, None, load_merges=True)
        if not self.specials.merges:
            raise ConversionError(f"{f.path / 'tokenizer.json'}: no BPE merges (nor merges.txt)")
        self.pooling = pooling_type(f), classifier_pooling(f)

    def plan(self, parts: SafetensorParts) -> list[Planned]:
        labels = self.labels
        found = {n: (hf, parts.shape(hf)) for hf in parts.names() if (n := gguf_name(hf, labels is not None)) is not None}
        f = self.folder
        h, ff, layers = f.int("hidden_size"), f.int("intermediate_size"), f.int("num_hidden_layers")
        want = {"token_embd.weight": (f.int("vocab_size"), h), "token_embd_norm.weight": (h,),
                "output_norm.weight": (h,), "cls.weight": (h, h), "cls.norm.weight": (h,)}
        want |= layer_shapes(layers, {
            "attn_norm.weight": (h,), "attn_qkv.weight": (3 * h, h), "attn_output.weight": (h, h),
            "ffn_norm.weight": (h,), "ffn_up.weight": (2 * ff, h), "ffn_down.weight": (h, ff)})
        if labels:
            want |= {"cls.output.weight": (len(labels), h), "cls.output.bias": (len(labels),)}

        def why(name: str) -> str:
            if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
                return f"it is beyond the {layers} layers of num_hidden_layers"
            if name.startswith("cls"):
                return ("a classifier with the placeholder labels LABEL_0, LABEL_1 becomes llama.cpp's `cls`, "
                        "which is the head's dense layer: give config.json's id2label the real label names")
            return "llama.cpp's modern-bert has no such tensor"

        check_tensors(found, want, OPTIONAL, why, lambda n: hf_name_of(n, WHOLE, LAYER_PREFIX, LAYER),
                      pairs=("cls.output",))
        return planned(parts, found)

    def add_parameters(self, w: GGUFWriter, ftype: LlamaFileType) -> None:
        c = self.folder.config
        add_text_parameters(w, c, ftype)
        add_bert_parameters(w, self.arch, self.pooling, self.labels)
        w.add_sliding_window(c["local_attention"])
        w.add_uint32(f"{self.arch}.attention.sliding_window_pattern", c["global_attn_every_n_layers"])
        w.add_rope_scaling_type(RopeScalingType.NONE)
        w.add_vocab_size(c["vocab_size"])
        if c["hidden_activation"]:
            w.add_string(f"{self.arch}.hidden_activation", c["hidden_activation"])

    def add_vocab(self, w: GGUFWriter) -> None:
        """ModernBertModel.set_vocab: BOS, EOS and SEP added (unless the tokenizer's post-processor
        says otherwise, whose answer gguf-py writes over these), then the gpt2 vocabulary."""
        add = dict(self.specials.add)
        for typ in ("bos", "eos", "sep"):
            w.add_bool(f"tokenizer.ggml.add_{typ}_token", add.pop(typ, True))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(self.vocab.pre)
        w.add_token_list(self.vocab.tokens)
        w.add_token_types(self.vocab.types)
        replace(self.specials, add=add).write(w)
