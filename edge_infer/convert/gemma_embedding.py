"""gemma-embedding (Gemma3TextModel: EmbeddingGemma) as llama.cpp's EmbeddingGemma converter
(over Gemma3Model) writes it: config.json with transformers' Gemma3TextConfig defaults (4.57, the
converter's pin), gemma3's tensors under gguf-py's GEMMA_EMBEDDING names with 1 added to every
RMSNorm weight (Gemma3RMSNorm scales by 1 + w), the SentencePiece vocabulary (spm_vocab) with
its special tokens and no space prefix, config.json's own sliding_window (transformers halves it
for bidirectional attention), the pooling, and with dense_modules sentence-transformers' Dense
projections (st_dense) first among the tensors, as llama.cpp's --sentence-transformers-dense-modules.

Refused, as llama.cpp's gemma-embedding graph would compute them wrongly: causal attention,
another layer pattern than five sliding layers to one full (its loader's fixed pattern), a query
scale other than 1/sqrt(head_dim), attention biases or logit soft-capping, another activation
than GELU, RoPE scaling, a vocabulary without tokenizer.model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from edge_infer.convert.bert import GELU_NAMES
from edge_infer.convert.hf_folder import (
    HFFolder,
    SafetensorParts,
    check_heads,
    check_number,
    check_sizes,
    classifier_pooling,
    pooling_type,
)
from edge_infer.convert.model_base import (
    Converter,
    Planned,
    check_tensors,
    hf_name_of,
    layer_shapes,
    map_name,
)
from edge_infer.convert.special_vocab import read_specials
from edge_infer.convert.spm_vocab import read_spm_vocab
from edge_infer.convert.st_dense import DenseModule, dense_module_paths, read_dense_modules
from edge_infer.convert.text_params import add_text_parameters, check_plain_rope
from edge_infer.errors import ConversionError

log = logging.getLogger(__name__)

# transformers 4.57's Gemma3TextConfig defaults that the converter reads (AutoConfig fills them in)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "attention_bias": False,
    "query_pre_attn_scalar": 256, "layer_types": None, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "rope_scaling": None, "rope_local_base_freq": 10_000.0,
    "use_bidirectional_attention": False,
}
INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window")
SWA_PATTERN = 6  # llama.cpp's gemma-embedding: layers 0-4 of every 6 sliding (its loader's default)
# gguf-py's tensor map for MODEL_ARCH.GEMMA_EMBEDDING, spelled out (names without "model.")
WHOLE = {"embed_tokens": "token_embd", "norm": "output_norm"}
LAYER_PREFIX = "layers."
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
         "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str | None:
    """The GGUF name llama.cpp gives the Hugging Face tensor `hf` (None for the rotary buffers
    its converter drops)."""
    name = hf[6:] if hf.startswith("model.") else hf
    if name.endswith(".rotary_emb.inv_freq"):
        return None
    mapped = map_name(name, WHOLE, LAYER_PREFIX, LAYER)
    if mapped is None:
        why = " (a language-model head: EmbeddingGemma has none)" if name.startswith("lm_head.") else ""
        raise ConversionError(f"tensor {hf!r} is not one of gemma-embedding's tensors{why}")
    return mapped


def sliding_layers(c: dict[str, Any]) -> list[bool]:
    """Which layers slide, as transformers builds layer_types (from sliding_window_pattern when
    config.json has no list)."""
    types = c.get("layer_types")
    if types is None:
        period = c.get("sliding_window_pattern", 6)
        return [bool((i + 1) % period) for i in range(c["num_hidden_layers"])] if isinstance(period, int) and period > 0 else []
    return [t == "sliding_attention" for t in types] if isinstance(types, list) else []


def gemma_embedding_config(path: Path, raw: dict[str, Any], arch: str) -> HFFolder:
    """config.json with Gemma3TextConfig's defaults, checked for what llama.cpp's gemma-embedding computes."""
    conf, c = path / "config.json", {**DEFAULTS, **raw}
    if "sliding_window" not in raw:
        raise ConversionError(f"{conf}: sliding_window is missing (llama.cpp's converter writes it from config.json)")
    check_sizes(conf, c, INT_FIELDS)
    check_heads(conf, c["num_attention_heads"], c["num_key_value_heads"], "num_attention_heads", "num_key_value_heads")
    check_number(conf, c, "rms_norm_eps")
    if c["final_logit_softcapping"] is not None:  # written as it is, though no embedding uses it
        check_number(conf, c, "final_logit_softcapping")
    if c["use_bidirectional_attention"] is not True:
        raise ConversionError(f"{conf}: use_bidirectional_attention is not true; llama.cpp's gemma-embedding attends "
                              "both ways (a causal Gemma3TextModel is not an EmbeddingGemma)")
    if c["hidden_activation"] not in GELU_NAMES:
        raise ConversionError(f"{conf}: hidden_activation {c['hidden_activation']!r} is not supported; llama.cpp's "
                              "gemma-embedding computes GELU")
    if c["attention_bias"]:
        raise ConversionError(f"{conf}: attention_bias true is not supported; llama.cpp's gemma-embedding has none")
    if c["attn_logit_softcapping"] is not None:
        raise ConversionError(f"{conf}: attn_logit_softcapping {c['attn_logit_softcapping']!r} is not supported "
                              "(gemma3 has none; llama.cpp's converter asserts it)")
    if c["query_pre_attn_scalar"] != c["head_dim"]:
        raise ConversionError(f"{conf}: query_pre_attn_scalar {c['query_pre_attn_scalar']!r} is not head_dim "
                              f"{c['head_dim']}; llama.cpp's gemma-embedding scales queries by 1/sqrt(head_dim)")
    want = [bool((i + 1) % SWA_PATTERN) for i in range(c["num_hidden_layers"])]
    if sliding_layers(c) != want:
        raise ConversionError(f"{conf}: layer_types (or sliding_window_pattern) is not five sliding layers to one "
                              "full, the only pattern llama.cpp's gemma-embedding loads from a converted file")
    check_plain_rope(conf, c)
    return HFFolder(path, c, arch)


class GemmaEmbeddingConverter(Converter):
    """Gemma3TextModel (EmbeddingGemma) -> `gemma-embedding`."""

    arch = "gemma-embedding"
    hf_architectures = ("Gemma3TextModel",)

    @classmethod
    def from_config(cls, path: Path, raw: dict[str, Any], arch: str) -> GemmaEmbeddingConverter:
        return cls(gemma_embedding_config(path, raw, arch))

    def prepare(self) -> None:
        f = self.folder
        self.vocab = read_spm_vocab(f.path, f.int("vocab_size"))
        self.specials = read_specials(f.path, len(self.vocab.tokens))
        self.pooling = pooling_type(f), classifier_pooling(f)
        self.dense: list[DenseModule] = []
        if self.dense_modules:
            self.dense = read_dense_modules(f.path, f.int("hidden_size"))
        elif paths := dense_module_paths(f.path):
            log.info("%s: its Dense modules %s are left out (dense_modules off, as llama.cpp's default): the "
                     "embeddings are the pooled hidden states", f.path, paths)

    def plan(self, parts: SafetensorParts) -> list[Planned]:
        """The Dense projections first (llama.cpp's generate_extra_tensors), then the model's
        tensors, checked by name and shape before any data is read."""
        found = {n: (hf, parts.shape(hf)) for hf in parts.names() if (n := gguf_name(hf)) is not None}
        f = self.folder
        h, ff, layers, hd = f.int("hidden_size"), f.int("intermediate_size"), f.int("num_hidden_layers"), f.int("head_dim")
        q, kv = f.int("num_attention_heads") * hd, f.int("num_key_value_heads") * hd
        want = {"token_embd.weight": (f.int("vocab_size"), h), "output_norm.weight": (h,)}
        want |= layer_shapes(layers, {
            "attn_norm.weight": (h,), "attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h),
            "attn_output.weight": (h, q), "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
            "post_attention_norm.weight": (h,), "ffn_norm.weight": (h,), "post_ffw_norm.weight": (h,),
            "ffn_gate.weight": (ff, h), "ffn_up.weight": (ff, h), "ffn_down.weight": (h, ff)})

        def why(name: str) -> str:
            if name.startswith("blk.") and int(name.split(".")[1]) >= layers:
                return f"it is beyond the {layers} layers of num_hidden_layers"
            return "llama.cpp's gemma-embedding has no such tensor (config.json says it has no biases)"

        check_tensors(found, want, (), why, lambda n: hf_name_of(n, WHOLE, LAYER_PREFIX, LAYER))
        plan = [Planned(f"{m.prefix}.weight", f"{m.path.name}/linear.weight", m.shape, _reader(m.parts, "linear.weight"))
                for m in self.dense]
        return plan + [Planned(name, hf, shape, _reader(parts, hf)) for name, (hf, shape) in found.items()]

    def add_parameters(self, w: GGUFWriter, ftype: LlamaFileType) -> None:
        """TextModel's keys; Gemma3Model's (all rewrites of those but the final soft-capping and
        the sliding window, which EmbeddingGemma rewrites with config.json's own); the Dense
        features; the pooling."""
        c = self.folder.config
        add_text_parameters(w, c, ftype)
        if c["final_logit_softcapping"]:
            w.add_final_logit_softcapping(c["final_logit_softcapping"])
        w.add_sliding_window(c["sliding_window"])
        for m in self.dense:  # gguf-py's add_dense_features_dims, which older gguf packages lack
            w.add_uint32(f"{self.arch}.{m.prefix}_feat_in", m.in_features)
            w.add_uint32(f"{self.arch}.{m.prefix}_feat_out", m.out_features)
        if self.pooling[0] is not None:
            w.add_pooling_type(self.pooling[0])
        if self.pooling[1] is not None:
            w.add_uint32(f"{self.arch}.classifier.pooling_type", self.pooling[1].value)

    def add_vocab(self, w: GGUFWriter) -> None:
        """Gemma3Model.set_vocab: _set_vocab_sentencepiece, then no space prefix."""
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(self.vocab.tokens)
        w.add_token_scores(self.vocab.scores)
        w.add_token_types(self.vocab.types)
        self.specials.write(w)
        w.add_add_space_prefix(False)


def _reader(parts: SafetensorParts, hf: str) -> Callable[[], np.ndarray]:
    """Reads `hf` as Gemma3Model.modify_tensors passes it on: 1 added to every norm weight, in
    the tensor's own precision (float16 stays float16 until it is stored as F32, as torch adds)."""
    def read() -> np.ndarray:
        a = parts.get(hf)
        return a + a.dtype.type(1) if hf.endswith("norm.weight") else a

    return read
