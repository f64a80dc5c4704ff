"""Tiny random-weight GGUFs of llama.cpp's `gemma3n` text architecture (its src/models/gemma3n.cpp
loader and graph), for the llama.cpp comparison in tests/models/test_gemma3n.py.

llama.cpp hard-codes most of gemma3n's shape: 4 AltUp streams, LAuReL rank 64, per-layer inputs
256 wide, activation sparsity (Gaussian top-k) on layers < 10, K/V computed by layers < 20 only
(a later layer reads layer 19's if full, 18's if sliding), attention scale 1, final softcap 30.
So the per-layer tensors are 256 wide whatever d_model is, and a file of more than 20 layers
shares KV. Every feature is sized to bite (tests/models/test_gemma3n.py checks it in llama.cpp)
yet gently enough that 22 layers do not amplify llama.cpp's rounding past the comparison's 1e-3:
the AltUp router's tanh is far from 0, LAuReL and the per-layer input add as much as attention
does, the sliding window (8) is short of the prompt and the logits reach the softcap.

The random draws do not depend on qtype (beyond rounding), swa_period, sliding_window,
converter_keys or tied (output.weight is drawn last): files that differ only in those hold the
same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gemma_models import write_meta
from gguf import GGUFWriter
from tiny_models import VOCAB_SIZE, _add_tokenizer, _Weights, finish

ARCH = "gemma3n"
N_ALTUP, LAUREL_RANK, PER_LAYER = 4, 64, 256  # llama.cpp's hard-coded sizes (llama-hparams.h)
KV_FROM_START, SPARSE_LAYERS = 20, 10  # layers < 20 have their own KV; layers < 10 are sparse
SPARSITY_STD_MUL = 1.6448533535003662  # Phi^-1(0.95)


def swa_layers(n_layers: int, swa_period: int | None) -> list[bool]:
    """Per layer, True = sliding window: the last of every `swa_period` layers is full (None:
    llama.cpp's default for gemma3n when the key is absent, a period of 5)."""
    period = 5 if swa_period is None else swa_period
    return [i % period < period - 1 for i in range(n_layers)]


def write_gemma3n(
    path: Path,
    qtype: str = "F32",
    *,
    seed: int = 0,
    n_layers: int = 4,
    d_model: int = 64,
    n_heads: int = 2,
    head_dim: int = 32,
    kv_heads: int = 1,
    ffn: int = 128,
    sliding_window: int = 8,
    swa_period: int | None = 2,
    converter_keys: bool = True,
    tied: bool = True,
    context_length: int = 256,
) -> Path:
    """A gemma3n model at `path` (the tiny byte-level BPE vocabulary). swa_period: every
    swa_period-th layer full, written as the converter does (a bool array); None leaves the key
    out (llama.cpp's period 5). converter_keys: also write what the converter writes and llama.cpp
    ignores (AltUp sizes, per-layer width, shared KV layers, sparsity multipliers, softcap, an
    array feed_forward_length); False writes only the keys llama.cpp reads. tied=False adds an
    output.weight. Matrices are `qtype` (F32, F16 or a quant type: Q8_0 wants d_model, ffn and
    n_heads * head_dim multiples of 32), except that, as llama-quantize does, a quant type leaves
    the altup*, laurel* and per_layer_model_proj tensors F32; vectors and AltUp coefficients F32."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    swa = swa_layers(n_layers, swa_period)
    if n_layers > KV_FROM_START:
        assert swa[KV_FROM_START - 2] and not swa[KV_FROM_START - 1], "KV sharing needs 18 sliding, 19 full"

    w = GGUFWriter(str(path), ARCH)
    w.add_name("tiny random model")
    # full layers' RoPE base 1e5 (real files: 1e6, which barely turns most pairs in 96 tokens)
    meta: dict[str, object] = {
        "context_length": context_length, "embedding_length": d_model, "block_count": n_layers,
        "feed_forward_length": ffn, "attention.head_count": n_heads, "attention.head_count_kv": kv_heads,
        "attention.key_length": head_dim, "attention.value_length": head_dim,
        "rope.freq_base": 1e5, "attention.sliding_window": sliding_window,
        "attention.layer_norm_rms_epsilon": 1e-6,
    }
    if swa_period is not None:
        meta["attention.sliding_window_pattern"] = swa
    if converter_keys:
        meta.update({
            "feed_forward_length": [ffn] * n_layers, "rope.freq_base_swa": 10000.0,
            "altup.active_idx": 0, "altup.num_inputs": N_ALTUP, "embedding_length_per_layer_input": PER_LAYER,
            "attention.shared_kv_layers": max(0, n_layers - KV_FROM_START), "final_logit_softcapping": 30.0,
            # the converter's Phi^-1(activation_sparsity_pattern): 0.95 on the first 10 layers, 0 after
            "activation_sparsity_scale": [SPARSITY_STD_MUL if i < SPARSE_LAYERS else float("-inf")
                                          for i in range(n_layers)],
        })
    write_meta(w, ARCH, meta)
    _add_tokenizer(w, add_bos=True)

    # Every block output is RMS-normed by a weighted norm whose weights set how much it adds.
    # gemma3n is not a plain residual (LAuReL adds the normed input back and halves the sum, AltUp
    # mixes 4 streams), and with gemma4's sizes (post-norms ~1.5-2, AltUp coefficients ~0.3) it
    # amplified rounding ~1.5x a layer: exact math and llama.cpp (f16 GELU table, f16 KV cache)
    # drifted 2e-3 apart in 4 layers, 0.3 in 22. Post-norms ~0.3-0.4 and coefficients ~0.06 keep
    # that at 2e-4 (4 layers) to 4e-4 (22) while every feature still moves the logits by 3e-2 to
    # 0.5. Q/K norms of ~0.4 keep the unscaled attention soft (as in gemma_models.py);
    # output_norm ~20 gives logits of std ~13, which the softcap of 30 bends.
    wt = _Weights(w, qtype, seed, widen=float(np.sqrt(64 / d_model)))
    keep = _Weights(w, qtype if qtype.upper() in ("F32", "F16") else "F32", seed, widen=wt.widen)
    keep.rng = rng = wt.rng  # one stream of draws
    E, P, R, A = d_model, PER_LAYER, LAUREL_RANK, N_ALTUP

    def coef(name: str, rows: int, cols: int, std: float) -> None:
        w.add_tensor(name, rng.normal(0.0, std, (rows, cols)).astype(np.float32))

    wt.matrix("token_embd.weight", VOCAB_SIZE, E, std=0.1)
    wt.vector("output_norm.weight", E, mean=20.0, std=1.0)
    # streams 1-3 start as projections of the embedding (rescaled to its magnitude) and end
    # projected back: any scale does; near-orthogonal maps keep them apart
    keep.stack("altup_proj.weight", A - 1, E, E, std=1.0 / np.sqrt(E) / wt.widen)
    keep.stack("altup_unembd_proj.weight", A - 1, E, E, std=1.0 / np.sqrt(E) / wt.widen)
    # times 16 in the graph: rows of RMS ~1.1, as the normed projection's ~1
    wt.matrix("per_layer_token_embd.weight", VOCAB_SIZE, P * n_layers, std=0.07 / wt.widen)
    keep.matrix("per_layer_model_proj.weight", P * n_layers, E, std=0.2)
    wt.vector("per_layer_proj_norm.weight", P, mean=1.0, std=0.2)

    for i in range(n_layers):
        p = f"blk.{i}."
        wt.vector(p + "attn_norm.weight", E, mean=1.0, std=0.1)
        wt.matrix(p + "attn_q.weight", n_heads * head_dim, E, std=0.2)
        wt.matrix(p + "attn_k.weight", kv_heads * head_dim, E, std=0.2)  # also on KV-shared layers
        wt.matrix(p + "attn_v.weight", kv_heads * head_dim, E, std=0.2)
        wt.matrix(p + "attn_output.weight", E, n_heads * head_dim, std=0.2)
        wt.vector(p + "attn_q_norm.weight", head_dim, mean=0.4, std=0.08)
        wt.vector(p + "attn_k_norm.weight", head_dim, mean=0.4, std=0.08)
        wt.vector(p + "post_attention_norm.weight", E, mean=0.4, std=0.04)
        wt.vector(p + "ffn_norm.weight", E, mean=1.0, std=0.1)
        wt.matrix(p + "ffn_gate.weight", ffn, E, std=0.15)
        wt.matrix(p + "ffn_up.weight", ffn, E, std=0.15)
        wt.matrix(p + "ffn_down.weight", E, ffn, std=0.2)
        wt.vector(p + "post_ffw_norm.weight", E, mean=0.3, std=0.04)
        # per-layer input: gelu(inp_gate @ stream 0) * this layer's input, projected and normed
        wt.matrix(p + "inp_gate.weight", P, E, std=0.1)
        wt.matrix(p + "proj.weight", E, P, std=0.1)
        wt.vector(p + "post_norm.weight", E, mean=0.3, std=0.04)
        # AltUp: the router sees rms(x) * norm / E, so weights of ~4 give tanh inputs of ~0.5;
        # small coefficients (above); correct_scale only feeds the per-layer gate
        keep.matrix(p + "altup_router.weight", A, E, std=4.0)
        wt.vector(p + "altup_router_norm.weight", E, mean=1.0, std=0.2)
        coef(p + "altup_predict_coef.weight", A * A, A, std=0.06)
        coef(p + "altup_correct_coef.weight", A, A, std=0.06)
        wt.vector(p + "altup_correct_scale.weight", E, mean=1.0, std=0.3)
        # LAuReL: h + norm(laurel_r @ laurel_l @ h), added beside attention
        keep.matrix(p + "laurel_l.weight", R, E, std=0.2)
        keep.matrix(p + "laurel_r.weight", E, R, std=0.2)
        wt.vector(p + "laurel_post_norm.weight", E, mean=0.3, std=0.04)
    if not tied:
        wt.matrix("output.weight", VOCAB_SIZE, E, std=0.1)
    finish(w)
    return path
