"""nomic-bert (NomicBertModel: nomic-embed-text v1 and v1.5) as llama.cpp's NomicBertModel
converts it: config.json as it is (its model type needs remote code, so AutoConfig adds no
defaults), the context cut to the trained 2048 tokens, the fused QKV and SwiGLU FFN under
gguf-py's NOMIC_BERT names, rope.freq_base from rotary_emb_base, BERT's WordPiece vocabulary.

Refused, as llama.cpp's converter asserts them away: the mixture-of-experts variant
(nomic-embed-text-v2-moe, with its SentencePiece vocabulary), biases, pre-norm, causal or
partial or interleaved RoPE, another activation than SwiGLU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFWriter, LlamaFileType

from edge_infer.convert.bert import add_wordpiece_vocab
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
from edge_infer.convert.model_base import (
    Converter,
    Planned,
    bert_family_gguf_name,
    check_tensors,
    hf_name_of,
    layer_shapes,
    planned,
)
from edge_infer.convert.special_vocab import read_json, read_specials
from edge_infer.convert.text_params import add_bert_parameters, add_text_parameters, check_plain_rope
from edge_infer.convert.vocab import read_vocab
from edge_infer.errors import ConversionError

# gguf-py's tensor map for MODEL_ARCH.NOMIC_BERT, spelled out (names after BertModel's filter)
WHOLE = {"embeddings.word_embeddings": "token_embd", "embeddings.token_type_embeddings": "token_types",
         "emb_ln": "token_embd_norm"}
LAYER_PREFIX = "encoder.layers."
LAYER = {"attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output", "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate",
         "mlp.fc2": "ffn_down", "norm1": "attn_output_norm", "norm2": "layer_output_norm"}
# what BertModel.filter_tensors and prepare_tensors drop
INT_FIELDS = ("n_embd", "n_head", "n_inner", "n_layer", "n_positions")
# config values llama.cpp's converter asserts (a missing key fails there too)
REQUIRED: dict[str, Any] = {
    "activation_function": "swiglu", "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
    "mlp_fc2_bias": False, "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None,
}
# nomic's own switches llama.cpp's graph has no place for: refused when set
NOT_SUPPORTED = ("use_rms_norm", "parallel_block", "moe_every_n_layers")
# (n_positions, max_trained_positions) -> the context llama.cpp writes
CONTEXTS = {(8192, 2048): 2048, (2048, 2048): 512}


def gguf_name(hf: str) -> str | None:
    """The GGUF name llama.cpp gives the Hugging Face tensor `hf`, or None when it drops it."""
    return bert_family_gguf_name(hf, WHOLE, LAYER_PREFIX, LAYER, "nomic-bert")


def nomic_config(path: Path, raw: dict[str, Any], arch: str) -> HFFolder:
    """config.json checked as llama.cpp's NomicBertModel.__init__ asserts it, n_positions set to
    the trained context."""
    conf = path / "config.json"
    for key in NOT_SUPPORTED:
        if raw.get(key):
            what = "the mixture-of-experts nomic-bert-moe" if key == "moe_every_n_layers" else f"{key} true"
            raise ConversionError(f"{conf}: {what} is not supported")
    for key, want in REQUIRED.items():
        if key not in raw:
            raise ConversionError(f"{conf}: {key} is missing (llama.cpp's converter needs it to be {want!r})")
        if raw[key] != want or isinstance(raw[key], bool) != isinstance(want, bool):
            raise ConversionError(f"{conf}: {key} {raw[key]!r} is not supported; llama.cpp's nomic-bert needs {want!r}")
    check_sizes(conf, raw, INT_FIELDS)
    check_heads(conf, raw["n_embd"], raw["n_head"], "n_embd", "n_head")
    trained = (raw["n_positions"], raw.get("max_trained_positions", 2048))
    if trained not in CONTEXTS:
        raise ConversionError(f"{conf}: n_positions {trained[0]} with max_trained_positions {trained[1]} is not a "
                              "nomic-embed-text configuration llama.cpp's converter recognises (8192 with 2048)")
    if "layer_norm_epsilon" not in raw:
        raise ConversionError(f"{conf}: layer_norm_epsilon is missing (llama.cpp's nomic-bert needs it)")
    check_number(conf, raw, "layer_norm_epsilon")
    check_sizes(conf, raw, tuple(k for k in ("vocab_size", "type_vocab_size") if k in raw))
    check_plain_rope(conf, raw)
    return HFFolder(path, {**raw, "n_positions": CONTEXTS[trained]}, arch)


class NomicBertConverter(Converter):
    """NomicBertModel -> `nomic-bert`."""

    arch = "nomic-bert"
    hf_architectures = ("NomicBertModel",)

    @classmethod
    def from_config(cls, path: Path, raw: dict[str, Any], arch: str) -> NomicBertConverter:
        return cls(nomic_config(path, raw, arch))

    def prepare(self) -> None:
        f = self.folder
        tok_json = f.path / "tokenizer.json"
        if not tok_json.is_file():
            raise ConversionError(f"{f.path}: no tokenizer.json (llama.cpp's converter reads nomic-bert's from it)")
        model = read_json(tok_json).get("model", {}).get("type")
        if model == "Unigram":
            raise ConversionError(f"{tok_json}: a Unigram (XLM-RoBERTa SentencePiece) vocabulary is not supported; "
                                  "nomic-bert needs WordPiece")
        self.labels = classifier_labels(f)
        self.vocab = read_vocab(f.path, f.config.get("vocab_size"), "WordPiece", self.arch)
        self.specials = read_specials(f.path, len(self.vocab.tokens))
        self.pooling = pooling_type(f), classifier_pooling(f)

    def plan(self, parts: SafetensorParts) -> list[Planned]:
        found = {name: (hf, parts.shape(hf)) for hf in parts.names() if (name := gguf_name(hf)) is not None}
        c = self.folder.config
        h, ff, layers = c["n_embd"], c["n_inner"], c["n_layer"]
        want = {"token_embd.weight": (len(self.vocab.tokens), h), "token_types.weight": (c.get("type_vocab_size", 1), h),
                "token_embd_norm.weight": (h,), "token_embd_norm.bias": (h,)}
        want |= layer_shapes(layers, {
            "attn_qkv.weight": (3 * h, h), "attn_output.weight": (h, h), "ffn_up.weight": (ff, h),
            "ffn_gate.weight": (ff, h), "ffn_down.weight": (h, ff), "attn_output_norm.weight": (h,),
            "attn_output_norm.bias": (h,), "layer_output_norm.weight": (h,), "layer_output_norm.bias": (h,)})

        def why(name: str) -> str:
            if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
                return f"it is beyond the {layers} layers of n_layer"
            return "llama.cpp's nomic-bert has no such tensor (config.json says it has no biases)"

        check_tensors(found, want, ("token_types.weight",), why, lambda n: hf_name_of(n, WHOLE, LAYER_PREFIX, LAYER))
        return planned(parts, found)

    def add_parameters(self, w: GGUFWriter, ftype: LlamaFileType) -> None:
        add_text_parameters(w, self.folder.config, ftype)
        add_bert_parameters(w, self.arch, self.pooling, self.labels)

    def add_vocab(self, w: GGUFWriter) -> None:
        add_wordpiece_vocab(w, self.folder.config.get("type_vocab_size", 1), self.vocab, self.specials)
