"""Tiny random-weight GGUFs of every dense architecture, in the tensor layout llama.cpp loads
(names, shapes, fused matrices, global rope-factor tensors), for the llama.cpp comparison in
tests/models/test_architectures.py. `meta` adds metadata keys (floats, ints or strings) that
switch features on; `factors` adds global rope-factor tensors (rope_freqs.weight, ...)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from tiny_models import VOCAB_SIZE, _add_tokenizer, _Weights, finish

NEOX_NORM = {"qwen3", "olmo2", "qwen3moe", "olmoe", "exaone4", "hunyuan-dense", "apertus"}  # per-head (qwen3) or full-width (olmo2, olmoe) QK norm
FULL_QK_NORM = {"olmo2", "olmoe"}
PRE_NORMS = {"llama", "qwen2", "qwen3", "phi3", "gemma2", "granite", "smollm3", "qwen2moe", "qwen3moe", "olmoe",
             "granitemoe", "ernie4_5", "ernie4_5-moe", "glm4", "hunyuan-dense", "apertus", "smallthinker"}
MOE = {"qwen2moe", "qwen3moe", "olmoe", "granitemoe", "ernie4_5-moe", "smallthinker", "gpt-oss"}  # and llama with expert_count
POST_NORMS = {"gemma2", "olmo2", "exaone4", "glm4"}
QKV_BIAS = {"qwen2", "qwen2moe", "glm4", "seed_oss", "gpt-oss"}
FUSED_GATE_UP = {"phi3", "glm4"}  # ffn_up holds [gate | up]
UNGATED_SHARED = {"granitemoe", "ernie4_5-moe"}  # the shared expert is added without a sigmoid gate


def write_arch_model(path: Path, arch: str, *, qtype: str = "F32", n_layers: int = 4, d_model: int = 64,
                     n_heads: int = 4, n_kv_heads: int = 2, ffn: int = 128, n_rot: int | None = None,
                     context_length: int = 128, seed: int = 0, output_std: float = 0.5, meta: dict[str, object] | None = None,
                     factors: dict[str, np.ndarray] | None = None, experts: tuple[int, int, int] | None = None,
                     shared_ffn: int = 0, router_std: float = 0.3, chat_template: str | None = None) -> Path:
    hd = d_model // n_heads
    q_dim, kv_dim = n_heads * hd, n_kv_heads * hd
    w = GGUFWriter(str(path), arch)
    # not the architecture's name: llama.cpp gives files named "phi3" per-token attributes that
    # need the real Phi-3 vocabulary
    w.add_name("tiny random model")
    for key, value in {"block_count": n_layers, "embedding_length": d_model, "attention.head_count": n_heads,
                       "attention.head_count_kv": n_kv_heads, "feed_forward_length": ffn,
                       "context_length": context_length, "rope.dimension_count": n_rot or hd}.items():
        w.add_uint32(f"{arch}.{key}", value)
    if experts:
        for key, value in (("expert_count", experts[0]), ("expert_used_count", experts[1]),
                           ("expert_feed_forward_length", experts[2])):
            w.add_uint32(f"{arch}.{key}", value)
        if shared_ffn:
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length", shared_ffn)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    for key, value in (meta or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))
    _add_tokenizer(w, add_bos=True, **({"chat_template": chat_template} if chat_template else {}))
    # wider models get proportionally smaller weights: the same activation and logit sizes
    wt = _Weights(w, qtype, seed, widen=float(np.sqrt(64 / d_model)))
    gemma = arch == "gemma2"
    wt.matrix("token_embd.weight", VOCAB_SIZE, d_model, std=0.5 / np.sqrt(d_model) if gemma else 0.5)
    if not gemma:
        wt.matrix("output.weight", VOCAB_SIZE, d_model, std=output_std)
    wt.vector("output_norm.weight", d_model, mean=1.0)
    for name, values in (factors or {}).items():
        w.add_tensor(name, values.astype(np.float32))
    dense_lead = int((meta or {}).get(f"{arch}.leading_dense_block_count", 0))  # type: ignore[call-overload]
    for i in range(n_layers):
        p = f"blk.{i}."
        if arch in PRE_NORMS:
            wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
            wt.vector(p + "ffn_norm.weight", d_model, mean=1.0)
        if arch in ("seed_oss", "gpt-oss"):  # the FFN pre-norm is named post_attention_norm
            wt.vector(p + "attn_norm.weight", d_model, mean=1.0)
            wt.vector(p + "post_attention_norm.weight", d_model, mean=1.0)
        if arch == "phi3":
            wt.matrix(p + "attn_qkv.weight", q_dim + 2 * kv_dim, d_model, std=0.2)
        else:
            wt.matrix(p + "attn_q.weight", q_dim, d_model, std=0.2)
            wt.matrix(p + "attn_k.weight", kv_dim, d_model, std=0.2)
            wt.matrix(p + "attn_v.weight", kv_dim, d_model, std=0.3)
        wt.matrix(p + "attn_output.weight", d_model, q_dim, std=0.3)
        if arch in QKV_BIAS:
            for name, n in (("attn_q.bias", q_dim), ("attn_k.bias", kv_dim), ("attn_v.bias", kv_dim)):
                wt.vector(p + name, n, std=0.1)
        if arch in NEOX_NORM:
            full = arch in FULL_QK_NORM
            wt.vector(p + "attn_q_norm.weight", q_dim if full else hd, mean=1.0, std=0.2)
            wt.vector(p + "attn_k_norm.weight", kv_dim if full else hd, mean=1.0, std=0.2)
        if arch in POST_NORMS:
            wt.vector(p + "post_attention_norm.weight", d_model, mean=1.0)
            wt.vector(p + "post_ffw_norm.weight", d_model, mean=1.0)
        moe_layer = experts and i >= dense_lead
        if moe_layer:
            _experts(wt, w, p, d_model, experts, shared_ffn, router_std, shared_gate=arch not in UNGATED_SHARED)
            if arch == "ernie4_5-moe":  # the selection bias
                w.add_tensor(p + "exp_probs_b.bias", wt.rng.normal(0.0, 0.3, experts[0]).astype(np.float32))
            if arch == "gpt-oss":  # biases of the router and every expert, sinks, an output bias
                rng, (n_exp, _, fe) = wt.rng, experts
                w.add_tensor(p + "ffn_gate_inp.bias", rng.normal(0.0, 0.5, n_exp).astype(np.float32))
                for name, width in (("ffn_gate_exps", fe), ("ffn_up_exps", fe), ("ffn_down_exps", d_model)):
                    w.add_tensor(p + name + ".bias", rng.normal(0.0, 0.3, (n_exp, width)).astype(np.float32))
                w.add_tensor(p + "attn_sinks.weight", rng.normal(1.0, 1.0, n_heads).astype(np.float32))
                wt.vector(p + "attn_output.bias", d_model, std=0.1)
        elif arch in FUSED_GATE_UP:
            wt.matrix(p + "ffn_up.weight", 2 * ffn, d_model)
        elif arch == "apertus":  # ungated: up, xIELU, down; and an attention-output bias
            wt.matrix(p + "ffn_up.weight", ffn, d_model)
            wt.vector(p + "attn_output.bias", d_model, std=0.1)
        else:
            wt.matrix(p + "ffn_gate.weight", ffn, d_model)
            wt.matrix(p + "ffn_up.weight", ffn, d_model)
        if not moe_layer:
            wt.matrix(p + "ffn_down.weight", d_model, ffn, std=0.3)
    finish(w)
    return path


def _experts(wt: _Weights, w: GGUFWriter, p: str, d: int, experts: tuple[int, int, int], shared_ffn: int,
             router_std: float, shared_gate: bool = True) -> None:
    """One layer's router, expert stacks [E, rows, cols] and shared expert (gated: qwen2moe)."""
    n_exp, _, fe = experts
    w.add_tensor(p + "ffn_gate_inp.weight", wt.rng.normal(0.0, router_std, (n_exp, d)).astype(np.float32))
    for name, rows, cols, std in (("ffn_gate_exps", fe, d, None), ("ffn_up_exps", fe, d, None),
                                  ("ffn_down_exps", d, fe, 0.3)):
        wt.stack(p + name + ".weight", n_exp, rows, cols, std=std)
    if shared_ffn and shared_gate:
        wt.vector(p + "ffn_gate_inp_shexp.weight", d, std=0.3)
    if shared_ffn:
        wt.matrix(p + "ffn_gate_shexp.weight", shared_ffn, d)
        wt.matrix(p + "ffn_up_shexp.weight", shared_ffn, d)
        wt.matrix(p + "ffn_down_shexp.weight", d, shared_ffn, std=0.3)
