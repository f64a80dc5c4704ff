"""The decoder forward pass shared by llama, qwen2 and gemma3: a batch of tokens from any number
of sequences in, logits for the requested rows out. Every matmul sees all the step's tokens at
once (one pass over the weights); attention reads each sequence's keys through its block table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.kernels_cpu import attention as attn_k
from edge_infer.kernels_cpu import matmul as mm_k
from edge_infer.kernels_cpu import matmul_i8 as i8_k
from edge_infer.kernels_cpu import ops
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights import ModelWeights, QMatrix

_NO_ROWS = np.empty((0, 1), np.uint8)  # an unused matrix of a three-matmul launch
_NO_I8 = (np.empty((0, 1, 256), np.uint8), np.empty((0, 1, 16), np.uint16), np.empty((0, 0, 0), np.uint16), 0)
_EMPTY = np.empty(0, np.float32)


def _or_empty(v: np.ndarray | None) -> np.ndarray:
    return _EMPTY if v is None else v


def i8_activation_buffers(t: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for T x K activations in the int8 kernel's form: xq4 int32 [T, K/4] (int8 codes
    packed 4 per int32), xd float32 [T, K/32] block scales, xsum int32 [T, K/32] block sums."""
    return np.empty((t, k // 4), np.int32), np.empty((t, k // 32), np.float32), np.empty((t, k // 32), np.int32)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [T, K] -> the int8 kernel's activations (see i8_activation_buffers)."""
    xq = i8_activation_buffers(*x.shape)
    i8_k.quantize_rows_q8(x, *xq)
    return xq


@dataclass(slots=True)
class StepInputs:
    """One forward's token-level arguments (N tokens, S sequences, M logit rows).

    tokens, positions: int32 [N]; slot_mapping: int64 [N] KV slot of each token (block *
    block_size + offset); token_seq: int32 [N] row of block_tables for each token;
    block_tables: int32 [S, max_blocks]; logits_rows: int64 [M] token rows whose logits are
    returned, in that order.
    """

    tokens: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    token_seq: np.ndarray
    block_tables: np.ndarray
    logits_rows: np.ndarray


class Transformer:
    """Runs the layers of one model with the CPU kernels; owns no KV memory (it is passed in)."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_threads: int) -> None:
        self.cfg, self.w, self.n_threads = cfg, weights, n_threads
        self.inv_freq = [self._inv_freq(layer) for layer in range(cfg.n_layers)]
        self.eps = np.float32(cfg.norm_eps)

    def _inv_freq(self, layer: int) -> np.ndarray:
        cfg = self.cfg
        base = cfg.layer_rope_base(layer)
        scale = 1.0 if cfg.swa_layers[layer] else cfg.rope_scale
        i = np.arange(cfg.n_rot // 2, dtype=np.float64)
        return base ** (-2.0 * i / cfg.n_rot) * scale

    def matmul(self, x: np.ndarray, w: QMatrix) -> np.ndarray:
        return self.matmuls(x, w)[0]

    def matmuls(self, x: np.ndarray, *ws: QMatrix) -> list[np.ndarray]:
        """One to three matmuls of the same input, out[m] = x @ ws[m].T: the int8 ones in one
        launch that also quantizes x, the float ones in another."""
        outs = [np.empty((x.shape[0], w.rows), np.float32) for w in ws]
        i8 = [(w.i8, o) for w, o in zip(ws, outs) if w.i8 is not None]
        if i8:
            args: list[object] = [x, *i8_activation_buffers(*x.shape)]
            for iw, o in i8:
                args += [iw.wi, iw.wd, iw.wm, iw.offset, o]
            for _ in range(3 - len(i8)):
                args += [*_NO_I8, np.empty((x.shape[0], 0), np.float32)]
            i8_k.matmul3_i8_kernel(*args, self.n_threads)
        fl = [(w, o) for w, o in zip(ws, outs) if w.i8 is None]
        if fl:
            args = []
            for w, o in fl:
                args += [w.data, w.qtype, o]
            for _ in range(3 - len(fl)):
                args += [_NO_ROWS, 0, np.empty((x.shape[0], 0), np.float32)]
            mm_k.matmul3_kernel(x, *args, self.n_threads)
        return outs

    def output_logits(self, x: np.ndarray) -> np.ndarray:
        """x [M, d_model] -> logits [M, vocab]."""
        return self.matmul(x, self.w.output)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        emb = self.w.token_embd
        h = np.empty((tokens.shape[0], self.cfg.d_model), np.float32)
        mm_k.embed_rows_kernel(tokens, emb.data, emb.qtype, h)
        if self.cfg.embed_scale != 1.0:
            ops.scale_kernel(h, np.float32(self.cfg.embed_scale))
        return h

    def forward(self, inp: StepInputs, kv: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
        """Logits float32 [M, vocab] for inp.logits_rows; writes this step's K/V into `kv`
        (per layer: k_cache, k_scale, v_cache, v_scale; see kernels_cpu.attention)."""
        cfg, eps = self.cfg, self.eps
        n = inp.tokens.shape[0]
        h = self.embed(inp.tokens)
        xn = np.empty_like(h)
        ops.rmsnorm_kernel(h, self.w.layers[0].attn_norm, eps, xn)
        attn = np.empty((n, cfg.q_dim), np.float32)
        act = np.empty((n, cfg.ffn_dim), np.float32)
        scale = np.float32(cfg.softmax_scale)
        for li, lw in enumerate(self.w.layers):
            q, k, v = self.matmuls(xn, lw.wq, lw.wk, lw.wv)
            k_cache, k_scale, v_cache, v_scale = kv[li]
            attn_k.qkv_finish_kernel(q, k, v, _or_empty(lw.bq), _or_empty(lw.bk), _or_empty(lw.bv),
                                     _or_empty(lw.q_norm), _or_empty(lw.k_norm), cfg.n_rot, inp.positions,
                                     self.inv_freq[li], cfg.rope_neox, eps, inp.slot_mapping,
                                     k_cache, k_scale, v_cache, v_scale)
            if li == cfg.n_layers - 1 and len(inp.logits_rows) < n:
                # Last layer: K/V of every token are stored; the rest is only needed for the
                # rows whose logits are wanted (llama.cpp's inp_out_ids does the same).
                sel = inp.logits_rows
                q, h, xn = np.ascontiguousarray(q[sel]), np.ascontiguousarray(h[sel]), np.empty((len(sel), cfg.d_model), np.float32)
                token_seq, positions = inp.token_seq[sel], inp.positions[sel]
                attn, act = attn[: len(sel)], act[: len(sel)]
            else:
                token_seq, positions = inp.token_seq, inp.positions
            attn_k.paged_attention_kernel(q, k_cache, k_scale, v_cache, v_scale, inp.block_tables, token_seq,
                                          positions, scale, cfg.layer_window(li), attn, self.n_threads)
            o = self.matmul(attn, lw.wo)
            if lw.post_attn_norm is not None:
                o2 = np.empty_like(o)
                ops.rmsnorm_kernel(o, lw.post_attn_norm, eps, o2)
                o = o2
            ops.add_rmsnorm_kernel(h, o, lw.ffn_norm, eps, xn)
            gate, up = self.matmuls(xn, lw.w_gate, lw.w_up)
            if cfg.activation == "gelu":
                ops.gelu_mul_kernel(gate, up, act)
            else:
                ops.silu_mul_kernel(gate, up, act)
            down = self.matmul(act, lw.w_down)
            if lw.post_ffn_norm is not None:
                d2 = np.empty_like(down)
                ops.rmsnorm_kernel(down, lw.post_ffn_norm, eps, d2)
                down = d2
            next_norm = self.w.layers[li + 1].attn_norm if li + 1 < cfg.n_layers else self.w.output_norm
            ops.add_rmsnorm_kernel(h, down, next_norm, eps, xn)
        rows = xn if xn.shape[0] == len(inp.logits_rows) else np.ascontiguousarray(xn[inp.logits_rows])
        logits = self.output_logits(rows)
        if cfg.final_logit_softcap:
            cap = np.float32(cfg.final_logit_softcap)
            np.multiply(np.tanh(logits / cap), cap, out=logits)
        return logits
