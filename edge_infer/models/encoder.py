"""Encoder: the forward pass of a bidirectional encoder (bert, nomic-bert, jina-bert-v2) as
llama.cpp's src/models/bert.cpp builds it, through the backend's kernels. A step holds whole
inputs side by side (no KV cache: each token attends over its own input's rows, both ways) and
returns every token's final hidden state; the rank head (llama.cpp's LLAMA_POOLING_TYPE_RANK
classification head) maps pooled rows to scores.

Each block is post-norm:
    x = LayerNorm(attention(x) + x)           (jina: and LayerNorm(x + input) once more)
    x = LayerNorm(FFN(x) + x)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edge_infer.models.backend import Array, EncoderBackend
from edge_infer.models.encoder_config import EncoderConfig
from edge_infer.models.encoder_weights import EncoderLayer, EncoderWeights

_EMPTY = np.empty(0, np.float32)


def alibi_slopes(n_heads: int, max_bias: float) -> np.ndarray:
    """ggml_soft_max_ext's ALiBi slope per head, float32 [n_heads] (empty when max_bias is 0)."""
    if max_bias <= 0:
        return _EMPTY
    n_log2 = 1 << int(math.floor(math.log2(n_heads)))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-max_bias / 2.0 / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_heads)],
                    np.float32)


def _rows(buf: Any, n: int, width: int) -> Any:
    """n contiguous rows of `width` out of a wider workspace buffer."""
    return buf[:n] if buf.shape[1] == width else buf.reshape(-1)[: n * width].reshape(n, width)


class Encoder:
    """Runs steps of up to `capacity` tokens (whole inputs) over the weights."""

    def __init__(self, cfg: EncoderConfig, weights: EncoderWeights, backend: EncoderBackend, capacity: int) -> None:
        self.cfg, self.w, self.b, self.capacity = cfg, weights, backend, capacity
        d, f = cfg.d_model, cfg.ffn_dim
        self.ws = backend.make_workspace(capacity, d, d, cfg.kv_dim, max(f, cfg.n_cls_out))
        self.eps = np.float32(cfg.norm_eps)
        self.scale = np.float32(1.0 / math.sqrt(cfg.head_dim))
        self.slopes = alibi_slopes(cfg.n_heads, cfg.alibi_max_bias)
        half = cfg.n_rot // 2
        self.inv_freq = cfg.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / max(cfg.n_rot, 1))
        # qkv_finish adds the biases and rotates; a one-slot pool it never writes (slot -1)
        self._no_kv = backend.make_kv_pool(1, 1, 1, cfg.n_kv_heads, cfg.head_dim, "f32")[0]
        self._no_store = np.full(capacity, -1, np.int32)

    def forward(self, tokens: Array, positions: Array, seq_start: Array, seq_end: Array) -> Array:
        """Hidden states float32 [T, D] (workspace rows: read before the next step) of T tokens
        (int32 [T]) at their positions within their input (int32 [T]), each attending over
        rows seq_start[t] .. seq_end[t] - 1 (int32 [T]: its input's rows in this step)."""
        b, ws, w, n = self.b, self.ws, self.w, int(tokens.shape[0])
        if not 0 < n <= self.capacity:
            raise ValueError(f"a step of {n} tokens (capacity {self.capacity})")
        h, x = ws.h[:n], ws.o[:n]
        b.embed(tokens, w.token_embd, np.float32(1.0), x)
        b.input_layernorm(x, w.type_row, w.positions, positions, w.input_norm.w, w.input_norm.b, self.eps, h)
        for lw in w.layers:
            self._ffn(lw, self._attention(lw, h, positions, seq_start, seq_end, n), n)
        return h

    def _attention(self, lw: EncoderLayer, h: Array, positions: Array, seq_start: Array, seq_end: Array,
                   n: int) -> Array:
        """The block's input to its FFN: LayerNorm(attention(h) + h) (jina: normed again after
        adding h), in ws.xn (ws.o2)."""
        cfg, b, ws, kv = self.cfg, self.b, self.ws, self.cfg.kv_dim
        q, k, v = ws.q[:n], _rows(ws.k, n, kv), _rows(ws.v, n, kv)
        b.matmuls(h, (lw.wq, lw.wk, lw.wv), (q, k, v), ws)
        b.qkv_finish(q, k, v, lw.bq, lw.bk, lw.bv, _EMPTY, _EMPTY, cfg.n_rot, positions, self.inv_freq, 1.0, True,
                     self.eps, self._no_store[:n], self._no_kv)
        attn = ws.attn[:n]
        if lw.q_norm is not None:  # jina: LayerNorms of the whole Q and K rows (attention then writes xn)
            b.layernorm(q, lw.q_norm.w, lw.q_norm.b, self.eps, attn)
            q, attn = attn, ws.xn[:n]
        if lw.k_norm is not None:
            normed = _rows(ws.gate, n, kv)
            b.layernorm(k, lw.k_norm.w, lw.k_norm.b, self.eps, normed)
            k = normed
        b.encoder_attention(q, k, v, seq_start, seq_end, cfg.head_dim, self.scale, self.slopes, attn)
        o = ws.o[:n]
        b.matmuls(attn, (lw.wo,), (o,), ws)
        b.add_layernorm(o, lw.bo, h, lw.attn_out_norm.w, lw.attn_out_norm.b, self.eps, ws.xn[:n])
        if lw.norm_2 is None:
            return ws.xn[:n]
        b.add_layernorm(ws.xn[:n], _EMPTY, h, lw.norm_2.w, lw.norm_2.b, self.eps, ws.o2[:n])
        return ws.o2[:n]

    def _ffn(self, lw: EncoderLayer, x: Array, n: int) -> None:
        """ws.h = LayerNorm(FFN(x) + x): the block's output."""
        b, ws = self.b, self.ws
        up, act, o = ws.up[:n], ws.act[:n], ws.o[:n]
        if lw.w_gate is None:  # bert: up (+ bias), GELU
            b.matmuls(x, (lw.w_up,), (up,), ws)
            b.bias_gelu(up, lw.b_up, act)
        else:
            gate = ws.gate[:n]
            b.matmuls(x, (lw.w_gate, lw.w_up), (gate, up), ws)
            if self.cfg.ffn == "swiglu":
                b.silu_mul(gate, up, act)
            else:  # jina: GELU(gate) times up (+ bias)
                if lw.b_up.size:
                    b.add(up, lw.b_up)
                b.gelu_mul(gate, up, act)
        b.matmuls(act, (lw.w_down,), (o,), ws)
        b.add_layernorm(o, lw.b_down, x, lw.out_norm.w, lw.out_norm.b, self.eps, ws.h[:n])

    def rank_head(self, pooled: np.ndarray) -> np.ndarray:
        """llama.cpp's rank pooling head over pooled rows float32 [B, D]: tanh(cls x + b), then
        the classifier cls_out (+ b) when the file has one -> float32 [B, n_out]."""
        if self.w.cls is None and self.w.cls_out is None:
            return pooled.astype(np.float32)
        rows = np.ascontiguousarray(pooled, np.float32)
        return np.concatenate([self._head(rows[i : i + self.capacity]) for i in range(0, rows.shape[0], self.capacity)])

    def _head(self, chunk: np.ndarray) -> np.ndarray:
        w, b, ws, n = self.w, self.b, self.ws, chunk.shape[0]
        x = ws.xn[:n]
        x[:] = chunk
        if w.cls is not None:
            y = _rows(ws.up, n, w.cls.rows)
            b.matmuls(x, (w.cls,), (y,), ws)
            y = np.tanh(b.to_host(y, True) + (w.cls_b if w.cls_b.size else 0.0)).astype(np.float32)
            if w.cls_out is None:
                return y
            x = _rows(ws.xn, n, y.shape[1])
            x[:] = y
        assert w.cls_out is not None
        out = _rows(ws.act, n, w.cls_out.rows)
        b.matmuls(x, (w.cls_out,), (out,), ws)
        res = b.to_host(out, True)
        return res + w.cls_out_b if w.cls_out_b.size else res
