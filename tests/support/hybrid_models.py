"""Tiny random-weight GGUFs of the hybrid recurrent architectures, in the tensor layout and
metadata llama.cpp loads (its src/models/<arch>.cpp), for the llama.cpp comparison in
tests/models/test_hybrid_architectures.py. Weights are sized so every part bites: the
convolution's taps are large (a token's output depends on its neighbours), and the attention
layers reach back over the whole sequence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from arch_models import _experts
from gguf import GGUFWriter
from tiny_models import VOCAB_SIZE, _add_tokenizer, _Weights, finish


def _attention(wt: _Weights, p: str, d_model: int, kv_dim: int) -> None:
    """A layer's pre-norms (its block's and its FFN's) and GQA projections."""
    _norms(wt, p, d_model)
    wt.matrix(p + "attn_q.weight", d_model, d_model, std=0.2)
    wt.matrix(p + "attn_k.weight", kv_dim, d_model, std=0.2)
    wt.matrix(p + "attn_v.weight", kv_dim, d_model, std=0.3)
    wt.matrix(p + "attn_output.weight", d_model, d_model, std=0.3)


def _head(w: GGUFWriter, qtype: str, seed: int, d_model: int, output_std: float) -> _Weights:
    """The tokenizer, the embedding, the output norm and an untied output matrix; the writer of
    the rest (wider models get proportionally smaller weights)."""
    _add_tokenizer(w, add_bos=True)
    wt = _Weights(w, qtype, seed, widen=float(np.sqrt(64 / d_model)))
    wt.matrix("token_embd.weight", VOCAB_SIZE, d_model, std=output_std)
    wt.vector("output_norm.weight", d_model, mean=1.0)
    wt.matrix("output.weight", VOCAB_SIZE, d_model, std=output_std)
    return wt


def _ffn(wt: _Weights, p: str, d_model: int, ffn: int) -> None:
    wt.matrix(p + "ffn_gate.weight", ffn, d_model)
    wt.matrix(p + "ffn_up.weight", ffn, d_model)
    wt.matrix(p + "ffn_down.weight", d_model, ffn, std=0.3)


def _norms(wt: _Weights, p: str, d_model: int) -> None:
    wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
    wt.vector(p + "ffn_norm.weight", d_model, mean=1.0)


def _mamba2(wt: _Weights, w: GGUFWriter, p: str, d_model: int, d_inner: int, d_state: int, ssm_heads: int,
            groups: int, d_conv: int, norm: bool = True) -> None:
    """A Mamba2 block's tensors (llama.cpp's names and shapes). The scan's decay is slow
    (softplus(dt) * |A| about 0.01-0.05 a token), so the state carries a token's influence over
    tens of tokens."""
    rng, conv_dim = wt.rng, d_inner + 2 * groups * d_state
    wt.matrix(p + "ssm_in.weight", 2 * d_inner + 2 * groups * d_state + ssm_heads, d_model, std=0.2)
    w.add_tensor(p + "ssm_conv1d.weight", rng.normal(0.0, 0.5, (conv_dim, d_conv)).astype(np.float32))
    w.add_tensor(p + "ssm_conv1d.bias", rng.normal(0.0, 0.1, conv_dim).astype(np.float32))
    w.add_tensor(p + "ssm_dt.bias", rng.uniform(-4.5, -3.0, ssm_heads).astype(np.float32))
    w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(-1.0, 0.5, (ssm_heads, 1))).astype(np.float32))
    w.add_tensor(p + "ssm_d", rng.normal(1.0, 0.3, (ssm_heads, 1)).astype(np.float32))
    if norm:
        w.add_tensor(p + "ssm_norm.weight", rng.normal(1.0, 0.1, (groups, d_inner // groups)).astype(np.float32))
    wt.matrix(p + "ssm_out.weight", d_model, d_inner, std=0.2)


# LFM2's layer kinds, shortened: a convolution first and last (the last layer's row selection)
LFM2_LAYERS = ("conv", "attn", "conv", "conv", "attn", "conv")


def write_lfm2(path: Path, *, qtype: str = "F32", layers: tuple[str, ...] = LFM2_LAYERS, d_model: int = 64,
               n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 128, l_cache: int = 3, context_length: int = 256,
               conv_std: float = 0.6, seed: int = 0, sliding_window: int = 0, output_std: float = 0.5,
               experts: tuple[int, int, int] | None = None, dense_lead: int = 2) -> Path:
    """An lfm2 model: `layers` names each layer's kind ("conv" or "attn"); l_cache the
    convolution's width in tokens; a tied output (as LFM2's). experts (E, k, width): lfm2moe,
    its layers from dense_lead on a mixture of experts with sigmoid routing and a selection bias."""
    arch, hd = "lfm2moe" if experts else "lfm2", d_model // n_heads
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny random model")
    for key, value in {"block_count": len(layers), "embedding_length": d_model, "attention.head_count": n_heads,
                       "feed_forward_length": ffn, "context_length": context_length, "shortconv.l_cache": l_cache,
                       "vocab_size": VOCAB_SIZE}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_array(f"{arch}.attention.head_count_kv", [n_kv_heads if k == "attn" else 0 for k in layers])
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    if sliding_window:
        w.add_uint32(f"{arch}.attention.sliding_window", sliding_window)
    if experts:
        for key, value in (("expert_count", experts[0]), ("expert_used_count", experts[1]),
                           ("expert_feed_forward_length", experts[2]), ("leading_dense_block_count", dense_lead),
                           ("expert_gating_func", 2)):
            w.add_uint32(f"{arch}.{key}", value)
    _add_tokenizer(w, add_bos=True)
    wt = _Weights(w, qtype, seed, widen=float(np.sqrt(64 / d_model)))
    wt.matrix("token_embd.weight", VOCAB_SIZE, d_model, std=output_std)
    wt.vector("token_embd_norm.weight", d_model, mean=1.0)
    for i, kind in enumerate(layers):
        p = f"blk.{i}."
        if kind == "attn":
            _attention(wt, p, d_model, n_kv_heads * hd)
            wt.vector(p + "attn_q_norm.weight", hd, mean=1.0, std=0.2)
            wt.vector(p + "attn_k_norm.weight", hd, mean=1.0, std=0.2)
        else:
            _norms(wt, p, d_model)
            wt.matrix(p + "shortconv.in_proj.weight", 3 * d_model, d_model, std=0.3)
            # [D, L] taps (GGUF shape (L, D)), kept in float32 as llama.cpp's quantizer keeps them
            w.add_tensor(p + "shortconv.conv.weight", wt.rng.normal(0.0, conv_std, (d_model, l_cache)).astype(np.float32))
            wt.matrix(p + "shortconv.out_proj.weight", d_model, d_model, std=0.3)
        if experts and i >= dense_lead:
            _experts(wt, w, p, d_model, experts, 0, 1.0)
            w.add_tensor(p + "exp_probs_b.bias", wt.rng.normal(0.0, 0.3, experts[0]).astype(np.float32))
            continue
        _ffn(wt, p, d_model, ffn)
    finish(w)
    return path


GRANITE_LAYERS = ("ssm", "attn", "ssm", "ssm", "attn", "ssm")


def write_granitehybrid(path: Path, *, qtype: str = "F32", layers: tuple[str, ...] = GRANITE_LAYERS,
                        d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 128, d_state: int = 16,
                        ssm_heads: int = 8, groups: int = 2, d_conv: int = 4, context_length: int = 256,
                        rope: bool = False, multipliers: bool = True, seed: int = 0, output_std: float = 0.5,
                        experts: tuple[int, int, int] | None = None, shared_ffn: int = 0, qwen3next: bool = False) -> Path:
    """A granitehybrid model: `layers` names each layer's kind ("ssm" for Mamba2, "attn");
    d_inner = 2 * d_model (llama.cpp asserts it); experts (E, k, width) and an ungated shared
    expert of shared_ffn instead of the dense FFN (Granite 4.0-H Tiny's layout)."""
    arch, hd, d_inner = "granitehybrid", d_model // n_heads, 2 * d_model
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny random model")
    for key, value in {"block_count": len(layers), "embedding_length": d_model, "attention.head_count": n_heads,
                       "feed_forward_length": experts[2] if experts else ffn, "context_length": context_length,
                       "ssm.conv_kernel": d_conv,
                       "ssm.inner_size": d_inner, "ssm.state_size": d_state, "ssm.time_step_rank": ssm_heads,
                       "ssm.group_count": groups}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_array(f"{arch}.attention.head_count_kv", [n_kv_heads if k == "attn" else 0 for k in layers])
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_bool(f"{arch}.rope.scaling.finetuned", rope)
    if experts:
        w.add_uint32(f"{arch}.expert_count", experts[0])
        w.add_uint32(f"{arch}.expert_used_count", experts[1])
        if shared_ffn:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", shared_ffn)
    if multipliers:
        for key, value in (("embedding_scale", 3.0), ("residual_scale", 0.4), ("attention.scale", 0.6),
                           ("logit_scale", 4.0)):
            w.add_float32(f"{arch}.{key}", value)
    wt = _head(w, qtype, seed, d_model, output_std)
    for i, kind in enumerate(layers):
        p = f"blk.{i}."
        if kind == "attn":
            _attention(wt, p, d_model, n_kv_heads * hd)
        else:
            _norms(wt, p, d_model)
            _mamba2(wt, w, p, d_model, d_inner, d_state, ssm_heads, groups, d_conv)
        if experts:
            _experts(wt, w, p, d_model, experts, shared_ffn, 0.3, shared_gate=False)
            continue
        _ffn(wt, p, d_model, ffn)
    finish(w)
    return path


def write_qwen35(path: Path, *, qtype: str = "F32", n_layers: int = 8, d_model: int = 64, n_heads: int = 4,
                 n_kv_heads: int = 2, head_dim: int = 16, n_rot: int = 8, sections: tuple[int, ...] = (2, 1, 1, 0),
                 ffn: int = 128, d_state: int = 16, v_heads: int = 4, k_heads: int = 2, d_conv: int = 4,
                 context_length: int = 256, seed: int = 0, output_std: float = 0.5, qkv_std: float = 0.6,
                 experts: tuple[int, int, int] | None = None, shared_ffn: int = 0, qwen3next: bool = False) -> Path:
    """A qwen35 model: every 4th layer gated attention (head_dim 16, partial RoPE of n_rot dims
    in `sections`), the rest Gated DeltaNet (v_heads value heads and k_heads key heads of
    d_state). qwen3next (with experts): NEOX RoPE, value heads grouped by key head, ssm_ba. The decay is slow (g about -0.01 to -0.05 a token): a token's write lasts."""
    arch = "qwen3next" if qwen3next else "qwen35moe" if experts else "qwen35"
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    value_dim, key_dim = v_heads * d_state, k_heads * d_state
    conv_dim = 2 * key_dim + value_dim
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny random model")
    for key, value in {"block_count": n_layers, "embedding_length": d_model, "attention.head_count": n_heads,
                       "attention.head_count_kv": n_kv_heads, "attention.key_length": head_dim,
                       "attention.value_length": head_dim, "feed_forward_length": ffn, "context_length": context_length,
                       "rope.dimension_count": n_rot, "ssm.conv_kernel": d_conv, "ssm.inner_size": value_dim,
                       "ssm.state_size": d_state, "ssm.time_step_rank": v_heads, "ssm.group_count": k_heads,
                       "full_attention_interval": 4}.items():
        w.add_uint32(f"{arch}.{key}", value)
    if not qwen3next:  # Qwen3-Next: NEOX, no sections
        w.add_array(f"{arch}.rope.dimension_sections", list(sections))
    if experts:  # qwen35moe: experts (E, k, width) and a gated shared expert
        for key, value in (("expert_count", experts[0]), ("expert_used_count", experts[1]),
                           ("expert_feed_forward_length", experts[2]), ("expert_shared_feed_forward_length", shared_ffn)):
            w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    wt = _head(w, qtype, seed, d_model, output_std)
    rng = wt.rng
    for i in range(n_layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
        wt.vector(p + "post_attention_norm.weight", d_model, mean=1.0)
        if (i + 1) % 4 == 0:
            wt.matrix(p + "attn_q.weight", 2 * q_dim, d_model, std=0.3)
            wt.matrix(p + "attn_k.weight", kv_dim, d_model, std=0.2)
            wt.matrix(p + "attn_v.weight", kv_dim, d_model, std=0.3)
            wt.matrix(p + "attn_output.weight", d_model, q_dim, std=0.3)
            wt.vector(p + "attn_q_norm.weight", head_dim, mean=1.0, std=0.2)
            wt.vector(p + "attn_k_norm.weight", head_dim, mean=1.0, std=0.2)
        else:
            wt.matrix(p + "attn_qkv.weight", conv_dim, d_model, std=qkv_std)
            wt.matrix(p + "attn_gate.weight", value_dim, d_model, std=0.3)
            w.add_tensor(p + "ssm_conv1d.weight", rng.normal(0.0, 0.5, (conv_dim, d_conv)).astype(np.float32))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(-4.5, -3.0, v_heads).astype(np.float32))
            w.add_tensor(p + "ssm_a", -np.exp(rng.uniform(-1.0, 0.5, v_heads)).astype(np.float32))
            if qwen3next:  # rows per key head: [b of its value heads | their a]
                wt.matrix(p + "ssm_ba.weight", 2 * v_heads, d_model, std=0.3)
            else:
                wt.matrix(p + "ssm_beta.weight", v_heads, d_model, std=0.3)
                wt.matrix(p + "ssm_alpha.weight", v_heads, d_model, std=0.3)
            w.add_tensor(p + "ssm_norm.weight", rng.normal(1.0, 0.1, d_state).astype(np.float32))
            wt.matrix(p + "ssm_out.weight", d_model, value_dim, std=0.3)
        if experts:
            _experts(wt, w, p, d_model, experts, shared_ffn, 0.3)
        else:
            _ffn(wt, p, d_model, ffn)
    finish(w)
    return path


# Nemotron-H's pattern, shortened: Mamba2 (M), FFN (-), attention (*), ending with an FFN layer
NEMOTRON_LAYERS = ("ssm", "ffn", "attn", "ffn", "ssm", "ssm", "ffn", "attn", "ssm", "ffn")


def write_nemotron_h(path: Path, *, qtype: str = "F32", layers: tuple[str, ...] = NEMOTRON_LAYERS,
                     d_model: int = 64, n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 128, d_inner: int = 96,
                     d_state: int = 16, ssm_heads: int = 6, groups: int = 2, d_conv: int = 4,
                     context_length: int = 256, seed: int = 0, output_std: float = 0.5) -> Path:
    """A nemotron_h model: `layers` names each layer's one block ("ssm", "attn", "ffn": relu^2,
    ungated); d_inner need not be 2 * d_model here."""
    arch, hd = "nemotron_h", d_model // n_heads
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny random model")
    for key, value in {"block_count": len(layers), "embedding_length": d_model, "attention.head_count": n_heads,
                       "context_length": context_length, "ssm.conv_kernel": d_conv, "ssm.inner_size": d_inner,
                       "ssm.state_size": d_state, "ssm.time_step_rank": ssm_heads, "ssm.group_count": groups}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_array(f"{arch}.attention.head_count_kv", [n_kv_heads if k == "attn" else 0 for k in layers])
    w.add_array(f"{arch}.feed_forward_length", [ffn if k == "ffn" else 0 for k in layers])
    w.add_float32(f"{arch}.attention.layer_norm_epsilon", 1e-5)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    wt = _head(w, qtype, seed, d_model, output_std)
    for i, kind in enumerate(layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
        if kind == "attn":
            wt.matrix(p + "attn_q.weight", d_model, d_model, std=0.2)
            wt.matrix(p + "attn_k.weight", n_kv_heads * hd, d_model, std=0.2)
            wt.matrix(p + "attn_v.weight", n_kv_heads * hd, d_model, std=0.3)
            wt.matrix(p + "attn_output.weight", d_model, d_model, std=0.3)
        elif kind == "ffn":
            wt.matrix(p + "ffn_up.weight", ffn, d_model)
            wt.matrix(p + "ffn_down.weight", d_model, ffn, std=0.3)
        else:
            _mamba2(wt, w, p, d_model, d_inner, d_state, ssm_heads, groups, d_conv)
    finish(w)
    return path


def write_falcon_h1(path: Path, *, qtype: str = "F32", n_layers: int = 4, d_model: int = 64, n_heads: int = 4,
                    n_kv_heads: int = 2, ffn: int = 128, d_inner: int = 96, d_state: int = 16, ssm_heads: int = 6,
                    groups: int = 2, d_conv: int = 4, context_length: int = 256, ssm_norm: bool = True, seed: int = 0,
                    output_std: float = 0.5) -> Path:
    """A falcon-h1 model: attention (RoPE in NEOX order) and Mamba2 side by side in every layer;
    the FFN's pre-norm named `blk.N.ffn_norm` (no ".weight", as gguf-py writes it); ssm_norm:
    whether the Mamba2 blocks have their grouped norm."""
    arch, hd = "falcon-h1", d_model // n_heads
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny random model")
    for key, value in {"block_count": n_layers, "embedding_length": d_model, "attention.head_count": n_heads,
                       "attention.head_count_kv": n_kv_heads, "attention.key_length": hd, "attention.value_length": hd,
                       "feed_forward_length": ffn, "context_length": context_length, "ssm.conv_kernel": d_conv,
                       "ssm.inner_size": d_inner, "ssm.state_size": d_state, "ssm.time_step_rank": ssm_heads,
                       "ssm.group_count": groups}.items():
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    wt = _head(w, qtype, seed, d_model, output_std)
    for i in range(n_layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
        wt.matrix(p + "attn_q.weight", d_model, d_model, std=0.2)
        wt.matrix(p + "attn_k.weight", n_kv_heads * hd, d_model, std=0.2)
        wt.matrix(p + "attn_v.weight", n_kv_heads * hd, d_model, std=0.3)
        wt.matrix(p + "attn_output.weight", d_model, d_model, std=0.3)
        _mamba2(wt, w, p, d_model, d_inner, d_state, ssm_heads, groups, d_conv, norm=ssm_norm)
        wt.vector(p + "ffn_norm", d_model, mean=1.0)
        _ffn(wt, p, d_model, ffn)
    finish(w)
    return path
