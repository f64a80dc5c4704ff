"""Tiny random-weight encoder GGUFs (bert, nomic-bert, jina-bert-v2) in exactly the layout
llama.cpp's src/models/bert.cpp loads: metadata as its converter (conversion/bert.py) writes it,
a small WordPiece vocabulary ("▁word" pieces, "##"-less continuations, [PAD] [UNK] [CLS] [SEP]
[MASK]), seeded weights. Options switch on each variant's features so a test can ablate them."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from tiny_models import _Weights

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(5)
WORDS = ("the", "cat", "sat", "on", "mat", "dog", "runs", "hello", "world", "query", "document", "paris",
         "france", "capital", "is", "of", "what", "a", "an", "and")
POOLING_IDS = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}


def vocab() -> tuple[list[str], list[int]]:
    """(tokens, token types): specials (control), whole words and letters ("▁x"), continuation
    letters and common suffixes ("x"), punctuation words."""
    words = [f"\u2581{w}" for w in WORDS] + [f"\u2581{c}" for c in string.ascii_lowercase + string.digits]
    pieces = list(string.ascii_lowercase) + ["ing", "s", "ed"]
    punct = [f"\u2581{c}" for c in ".,!?'-"]
    tokens = list(dict.fromkeys(list(SPECIALS) + words + pieces + punct))  # each once
    return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


@dataclass(frozen=True, slots=True)
class EncoderSpec:
    """Shapes and features of a tiny encoder. ffn_gelu_gated / geglu / qk_norm / norm_2 are
    jina-bert-v2's; rank_head adds cls and cls.output (pooling "rank")."""

    arch: str = "bert"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    ffn: int = 128
    context_length: int = 64
    pooling: str = "mean"
    fused_qkv: bool = False
    geglu: bool = False
    qk_norm: bool = False
    norm_2: bool = False
    rank_head: bool = False
    n_cls_out: int = 1
    biases: bool = True
    qk_std: float = 0.08  # larger: sharper attention, so positions (RoPE, ALiBi) matter more


def write_encoder(path: str | Path, spec: EncoderSpec = EncoderSpec(), qtype: str = "F32", seed: int = 0) -> Path:
    """Write the model; returns its path (a directory gets a file named after the arch)."""
    path = Path(path)
    if path.is_dir():
        path = path / f"tiny-{spec.arch}-{spec.pooling}-{qtype.lower()}.gguf"
    a, d, f = spec.arch, spec.d_model, spec.ffn
    w = GGUFWriter(str(path), a)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(d)
    w.add_feed_forward_length(f)
    w.add_block_count(spec.n_layers)
    w.add_head_count(spec.n_heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_uint32(f"{a}.pooling_type", POOLING_IDS[spec.pooling])
    if a == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    if spec.rank_head and spec.n_cls_out > 1:
        w.add_classifier_output_labels([f"label{i}" for i in range(spec.n_cls_out)])
    tokens, types = vocab()
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_unk_token_id(UNK)
    w.add_sep_token_id(SEP)
    w.add_pad_token_id(PAD)
    w.add_bos_token_id(CLS)  # gguf-py's SpecialVocab writes a BERT's [CLS] as its BOS
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)
    w.add_add_eos_token(False)
    w.add_mask_token_id(MASK)
    t = _Weights(w, qtype, seed, std=0.08)
    t.matrix("token_embd.weight", len(tokens), d, std=0.5)
    t.w.add_tensor("token_types.weight", t.rng.normal(0, 0.1, (2, d)).astype(np.float32))
    if a == "bert":
        t.w.add_tensor("position_embd.weight", t.rng.normal(0, 0.1, (spec.context_length, d)).astype(np.float32))
    _norm(t, "token_embd_norm", d)
    for i in range(spec.n_layers):
        _layer(t, spec, f"blk.{i}.")
    if spec.rank_head:
        t.matrix("cls.weight", d, d, std=0.2)
        t.vector("cls.bias", d, std=0.1)
        t.matrix("cls.output.weight", spec.n_cls_out, d, std=0.3)
        t.vector("cls.output.bias", spec.n_cls_out, std=0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _norm(t: _Weights, name: str, n: int) -> None:
    t.vector(f"{name}.weight", n, mean=1.0, std=0.1)
    t.vector(f"{name}.bias", n, std=0.1)


def _layer(t: _Weights, spec: EncoderSpec, p: str) -> None:
    d, f, bias = spec.d_model, spec.ffn, spec.biases
    if spec.fused_qkv:
        qkv = t.rng.normal(0.0, 0.08, (3 * d, d)).astype(np.float32)
        qkv[: 2 * d] *= spec.qk_std / 0.08
        t.w.add_tensor(p + "attn_qkv.weight", qkv)
        if bias:
            t.vector(p + "attn_qkv.bias", 3 * d, std=0.1)
    else:
        for x in "qkv":
            t.matrix(p + f"attn_{x}.weight", d, d, std=spec.qk_std if x != "v" else None)
            if bias:
                t.vector(p + f"attn_{x}.bias", d, std=0.1)
    if spec.qk_norm:
        _norm(t, p + "attn_q_norm", d)
        _norm(t, p + "attn_k_norm", d)
    t.matrix(p + "attn_output.weight", d, d)
    if bias:
        t.vector(p + "attn_output.bias", d, std=0.1)
    _norm(t, p + "attn_output_norm", d)
    if spec.norm_2:
        _norm(t, p + "attn_norm_2", d)
    if spec.arch == "bert":
        t.matrix(p + "ffn_up.weight", f, d)
    elif spec.geglu:
        t.matrix(p + "ffn_up.weight", 2 * f, d)
    else:
        t.matrix(p + "ffn_up.weight", f, d)
        t.matrix(p + "ffn_gate.weight", f, d)
    if bias and spec.arch != "nomic-bert" and not spec.geglu:
        t.vector(p + "ffn_up.bias", f, std=0.1)
    t.matrix(p + "ffn_down.weight", d, f)
    if bias and spec.arch != "nomic-bert":
        t.vector(p + "ffn_down.bias", d, std=0.1)
    _norm(t, p + "layer_output_norm", d)
