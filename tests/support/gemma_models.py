"""Tiny random-weight GGUFs of llama.cpp's `gemma4` text architecture (its src/models/gemma4.cpp
loader and graph), for the llama.cpp comparison in tests/models/test_gemma4.py.

Every gemma4 feature is on by default and sized to bite: sliding-window layers with their own
head dim, KV head count, RoPE base and rotary width; full layers with proportional RoPE
(rope_freqs: a quarter of the pairs rotate); per-layer embeddings (PLE); the last `shared_kv`
layers reading the KV of the last full / sliding layer before them, with double-wide MLPs; V as
the raw K projection on the full layers (no attn_v); per-layer output scales; a final logit
softcap the logits reach; and (moe=True) 26B-A4B's routed experts beside the dense MLP.

The random draws do not depend on k_eq_v, sliding_window or softcap: files that differ only
in those hold the same weights (a skipped attn_v is drawn and dropped)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from tiny_models import VOCAB_SIZE, _add_tokenizer, _Weights, finish

ARCH = "gemma4"


def swa_pattern(n_layers: int, shared_kv: int) -> list[bool]:
    """Per layer, True = sliding window. The KV layers repeat (SWA, SWA, full) ending on a full
    layer (so layer n_kv-1 is full and n_kv-2 sliding, as llama.cpp's KV sharing needs); the
    shared layers alternate sliding, full."""
    n_kv = n_layers - shared_kv
    kv = [(n_kv - 1 - i) % 3 != 0 for i in range(n_kv)]
    return kv + [(i - n_kv) % 2 == 0 for i in range(n_kv, n_layers)]


def write_meta(w: GGUFWriter, arch: str, values: dict[str, object]) -> None:
    """<arch>.<key> = value: ints UINT32, floats FLOAT32, lists arrays (INT32 / FLOAT32 / BOOL)."""
    for key, value in values.items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", int(value))  # type: ignore[call-overload]


def _skip(wt: _Weights, rows: int, cols: int) -> None:
    """Draw (and drop) a matrix's worth of numbers: later weights stay the same."""
    wt.rng.normal(0.0, 1.0, (rows, cols))


def write_gemma4(
    path: Path,
    qtype: str = "F32",
    *,
    seed: int = 0,
    n_layers: int = 6,
    ple: bool = True,
    shared_kv: int = 2,
    k_eq_v: bool = True,
    double_wide: bool = True,
    layer_scale: bool = True,
    moe: bool = False,
    d_model: int = 64,
    n_heads: int = 4,
    head_dim: int = 32,
    head_dim_swa: int = 16,
    kv_heads: int = 1,
    kv_heads_swa: int = 2,
    ffn: int = 128,
    per_layer: int = 32,
    experts: tuple[int, int, int] = (4, 2, 64),
    sliding_window: int = 8,
    softcap: float = 30.0,
    context_length: int = 256,
) -> Path:
    """A gemma4 model at `path` (tied output, the tiny byte-level BPE vocabulary). Matrices are
    `qtype` (F32, F16 or a quant type: Q8_0 wants every input width a multiple of 32, the
    K-quants of 256 - d_model, ffn, per_layer, n_heads * head dims); vectors, the router,
    rope_freqs and the layer scales F32. experts: (count, used, width) when moe."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert 0 <= shared_kv <= n_layers - 2, "llama.cpp needs at least 2 KV layers"
    swa = swa_pattern(n_layers, shared_kv)
    n_kv = n_layers - shared_kv
    hd = [head_dim_swa if s else head_dim for s in swa]
    hkv = [kv_heads_swa if s else kv_heads for s in swa]
    ff = [2 * ffn if double_wide and i >= n_kv else ffn for i in range(n_layers)]
    p_dim = per_layer if ple else 0
    n_exp, n_used, f_exp = experts

    w = GGUFWriter(str(path), ARCH)
    w.add_name("tiny random model")
    # full layers' base 1e5 (real files: 1e6): at 1e6 the pairs rope_freqs stops barely turn in
    # 96 tokens (ignoring rope_freqs moved llama.cpp's logits 0.8%; at 1e5 2.6%)
    meta: dict[str, object] = {
        "context_length": context_length, "embedding_length": d_model, "block_count": n_layers,
        "feed_forward_length": ff, "attention.head_count": n_heads, "attention.head_count_kv": hkv,
        "attention.key_length": head_dim, "attention.value_length": head_dim,
        "attention.key_length_swa": head_dim_swa, "attention.value_length_swa": head_dim_swa,
        "rope.dimension_count": head_dim, "rope.dimension_count_swa": head_dim_swa,
        "rope.freq_base": 1e5, "rope.freq_base_swa": 10000.0,
        "attention.sliding_window": sliding_window, "attention.sliding_window_pattern": swa,
        "attention.shared_kv_layers": shared_kv, "attention.layer_norm_rms_epsilon": 1e-6,
        "embedding_length_per_layer_input": p_dim, "final_logit_softcapping": float(softcap),
    }
    if moe:
        meta.update({"expert_count": n_exp, "expert_used_count": n_used, "expert_feed_forward_length": f_exp})
    write_meta(w, ARCH, meta)
    _add_tokenizer(w, add_bos=True)

    # Every block output is RMS-normed by its post-norm, so the post-norm weights set how much
    # each part adds to the residual (~1.5-2 each against the embedding's ~0.8): no one part, and
    # not the token's own (tied) embedding, dominates. output_norm ~20 makes logits of std ~13,
    # which the softcap of 30 bends. Attention is unscaled (gemma4's kq_scale is 1): Q/K norms of
    # ~0.4 give scores of std ~0.16 sqrt(D), soft enough that llama.cpp's f16 KV cache rounding
    # is not amplified past the comparison's 1e-3 (norms of ~1 measured 3e-3 to 1e-2).
    wt = _Weights(w, qtype, seed, widen=float(np.sqrt(64 / d_model)))
    wt.matrix("token_embd.weight", VOCAB_SIZE, d_model, std=0.1)
    wt.vector("output_norm.weight", d_model, mean=20.0, std=1.0)
    if not all(swa):  # proportional RoPE: the first quarter of the full head's pairs rotate
        n_r = head_dim // 4
        w.add_tensor("rope_freqs.weight", np.array([1.0] * n_r + [1e30] * (head_dim // 2 - n_r), np.float32))
    if ple:
        # times sqrt(P) in the graph: rows of RMS ~1.1, as the normed projection's ~1
        wt.matrix("per_layer_token_embd.weight", VOCAB_SIZE, p_dim * n_layers, std=0.2 * np.sqrt(32 / p_dim) / wt.widen)
        wt.matrix("per_layer_model_proj.weight", p_dim * n_layers, d_model, std=0.2)
        wt.vector("per_layer_proj_norm.weight", p_dim, mean=1.0, std=0.2)

    for i in range(n_layers):
        p, d, has_kv = f"blk.{i}.", hd[i], i < n_kv
        wt.vector(p + "attn_norm.weight", d_model, mean=1.0, std=0.1)
        wt.matrix(p + "attn_q.weight", n_heads * d, d_model, std=0.2)
        if has_kv:
            wt.matrix(p + "attn_k.weight", hkv[i] * d, d_model, std=0.2)
            if k_eq_v and not swa[i]:
                _skip(wt, hkv[i] * d, d_model)
            else:
                wt.matrix(p + "attn_v.weight", hkv[i] * d, d_model, std=0.2)
        wt.matrix(p + "attn_output.weight", d_model, n_heads * d, std=0.2)
        wt.vector(p + "attn_q_norm.weight", d, mean=0.4, std=0.08)
        if has_kv:
            wt.vector(p + "attn_k_norm.weight", d, mean=0.4, std=0.08)
        wt.vector(p + "post_attention_norm.weight", d_model, mean=2.0, std=0.2)
        wt.vector(p + "ffn_norm.weight", d_model, mean=1.0, std=0.1)
        wt.matrix(p + "ffn_gate.weight", ff[i], d_model, std=0.15)
        wt.matrix(p + "ffn_up.weight", ff[i], d_model, std=0.15)
        wt.matrix(p + "ffn_down.weight", d_model, ff[i], std=0.2)
        wt.vector(p + "post_ffw_norm.weight", d_model, mean=1.5, std=0.2)
        if moe:
            _moe(wt, w, p, d_model, n_exp, f_exp)
        if ple:
            wt.matrix(p + "inp_gate.weight", p_dim, d_model, std=0.1)
            wt.matrix(p + "proj.weight", d_model, p_dim, std=0.2)
            wt.vector(p + "post_norm.weight", d_model, mean=1.5, std=0.2)
        if layer_scale:
            w.add_tensor(p + "layer_output_scale.weight", np.array([0.5 + (i * 0.37) % 1.0], np.float32))
    finish(w)
    return path


def _moe(wt: _Weights, w: GGUFWriter, p: str, d_model: int, n_exp: int, f_exp: int) -> None:
    """26B-A4B's routed experts: a router (weights, input scale F32), the fused [gate; up]
    expert stack (gate rows first), the down stack with per-expert output scales, and their
    norms (pre_ffw_norm_2 on the experts' input, post_ffw_norm_1 on the dense MLP's output,
    post_ffw_norm_2 on the experts' sum)."""
    rng = wt.rng
    # the router's input is rms(x) / sqrt(d_model) * scale: unit length; logits of std ~1.5
    w.add_tensor(p + "ffn_gate_inp.weight", rng.normal(0.0, 1.5, (n_exp, d_model)).astype(np.float32))
    w.add_tensor(p + "ffn_gate_inp.scale", rng.normal(1.0, 0.3, d_model).astype(np.float32))
    wt.vector(p + "pre_ffw_norm_2.weight", d_model, mean=1.0, std=0.1)
    wt.vector(p + "post_ffw_norm_1.weight", d_model, mean=1.0, std=0.2)
    wt.vector(p + "post_ffw_norm_2.weight", d_model, mean=1.0, std=0.2)
    wt.stack(p + "ffn_gate_up_exps.weight", n_exp, 2 * f_exp, d_model, std=0.15)
    wt.stack(p + "ffn_down_exps.weight", n_exp, d_model, f_exp, std=0.2)
    w.add_tensor(p + "ffn_down_exps.scale", rng.uniform(0.3, 2.0, n_exp).astype(np.float32))
