"""Tiny random-weight encoder GGUFs (bert, nomic-bert, jina-bert-v2, modern-bert,
gemma-embedding) in exactly the layout
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
    window: int = 6  # modern-bert, gemma-embedding: the sliding layers' symmetric window
    head_dim: int = 0  # gemma-embedding: its own head size (0: d_model / n_heads)
    n_kv_heads: int = 0  # gemma-embedding: grouped K/V heads (0: n_heads)
    dense: int = 0  # gemma-embedding: dense_2 / dense_3's inner width (0: none)


def write_encoder(path: str | Path, spec: EncoderSpec = EncoderSpec(), qtype: str = "F32", seed: int = 0) -> Path:
    """Write the model; returns its path (a directory gets a file named after the arch)."""
    path = Path(path)
    if path.is_dir():
        path = path / f"tiny-{spec.arch}-{spec.pooling}-{qtype.lower()}.gguf"
    a, d = spec.arch, spec.d_model
    if a in ("modern-bert", "gemma-embedding"):
        return _write_pre_norm(path, spec, qtype, seed)
    w = _header(path, spec)
    w.add_layer_norm_eps(1e-12)
    if a == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    if spec.rank_head and spec.n_cls_out > 1:
        w.add_classifier_output_labels([f"label{i}" for i in range(spec.n_cls_out)])
    _add_vocab(w)
    t = _Weights(w, qtype, seed, std=0.08)
    t.matrix("token_embd.weight", len(vocab()[0]), d, std=0.5)
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
    _finish(w)
    return path


def _header(path: Path, spec: EncoderSpec) -> GGUFWriter:
    """A writer with the shape keys every encoder has: bidirectional, pooled as the spec says."""
    w = GGUFWriter(str(path), spec.arch)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.d_model)
    w.add_feed_forward_length(spec.ffn)
    w.add_block_count(spec.n_layers)
    w.add_head_count(spec.n_heads)
    w.add_causal_attention(False)
    w.add_uint32(f"{spec.arch}.pooling_type", POOLING_IDS[spec.pooling])
    return w


def _add_vocab(w: GGUFWriter) -> None:
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


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_pre_norm(path: Path, spec: EncoderSpec, qtype: str, seed: int) -> Path:
    """modern-bert (LayerNorms without biases, fused QKV and [gate | up], a final norm, an
    optional rank head with its norm) or gemma-embedding (gemma3's block with per-head Q/K
    RMSNorms and post-norms, dense_2 / dense_3 after pooling): sliding layers with a symmetric
    window and their own rope base."""
    a, d, f = spec.arch, spec.d_model, spec.ffn
    gemma = a == "gemma-embedding"
    hd = spec.head_dim or d // spec.n_heads
    kvh = spec.n_kv_heads or spec.n_heads
    w = _header(path, spec)
    w.add_head_count_kv(kvh)
    w.add_uint32(f"{a}.attention.sliding_window", spec.window)
    w.add_uint32(f"{a}.attention.sliding_window_pattern", 2 if gemma else 3)
    w.add_rope_freq_base(1000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 50.0)  # far from the full layers' base: the switch shows
    if gemma:
        w.add_layer_norm_rms_eps(1e-6)
        w.add_key_length(hd)
        w.add_value_length(hd)
        if spec.dense:
            for key, v in (("dense_2_feat_in", d), ("dense_2_feat_out", spec.dense), ("dense_3_feat_in", spec.dense),
                           ("dense_3_feat_out", d)):
                w.add_uint32(f"{a}.{key}", v)
    else:
        w.add_layer_norm_eps(1e-5)
    _add_vocab(w)
    t = _Weights(w, qtype, seed, std=0.08)
    t.matrix("token_embd.weight", len(vocab()[0]), d, std=0.5 / d**0.5 if gemma else 0.5)
    if not gemma:
        t.vector("token_embd_norm.weight", d, mean=1.0, std=0.1)
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        if gemma or i > 0:
            t.vector(p + "attn_norm.weight", d, mean=1.0, std=0.1)
        if gemma:
            t.matrix(p + "attn_q.weight", spec.n_heads * hd, d, std=spec.qk_std)
            t.matrix(p + "attn_k.weight", kvh * hd, d, std=spec.qk_std)
            t.matrix(p + "attn_v.weight", kvh * hd, d)
            t.vector(p + "attn_q_norm.weight", hd, mean=1.0, std=0.1)
            t.vector(p + "attn_k_norm.weight", hd, mean=1.0, std=0.1)
            t.vector(p + "post_attention_norm.weight", d, mean=1.0, std=0.1)
            t.vector(p + "post_ffw_norm.weight", d, mean=1.0, std=0.1)
            t.matrix(p + "ffn_gate.weight", f, d)
            t.matrix(p + "ffn_up.weight", f, d)
        else:
            t.matrix(p + "attn_qkv.weight", 3 * d, d, std=spec.qk_std)
            t.matrix(p + "ffn_up.weight", 2 * f, d)
        t.matrix(p + "attn_output.weight", d, spec.n_heads * hd)
        t.vector(p + "ffn_norm.weight", d, mean=1.0, std=0.1)
        t.matrix(p + "ffn_down.weight", d, f)
    t.vector("output_norm.weight", d, mean=1.0, std=0.1)
    if spec.rank_head:
        t.matrix("cls.weight", d, d, std=0.2)
        t.vector("cls.norm.weight", d, mean=1.0, std=0.1)
        t.matrix("cls.output.weight", spec.n_cls_out, d, std=0.3)
        t.vector("cls.output.bias", spec.n_cls_out, std=0.1)
    if gemma and spec.dense:
        t.matrix("dense_2.weight", spec.dense, d, std=0.1)
        t.matrix("dense_3.weight", d, spec.dense, std=0.1)
    _finish(w)
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
