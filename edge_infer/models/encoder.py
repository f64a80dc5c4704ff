"""Encoder: the forward pass of a bidirectional encoder as llama.cpp's src/models/bert.cpp
(bert, nomic-bert, jina-bert-v2), modern-bert.cpp and gemma-embedding.cpp build it, through the
backend's kernels. A step holds whole inputs side by side (no KV cache: each token attends over
its own input's rows, both ways, within a symmetric window on sliding layers) and returns every
token's final hidden state; the rank head (llama.cpp's LLAMA_POOLING_TYPE_RANK classification
head) maps pooled rows to scores, and gemma-embedding's dense layers project pooled rows.

BERT's blocks are post-norm:
    x = LayerNorm(attention(x) + x)           (jina: and LayerNorm(x + input) once more)
    x = LayerNorm(FFN(x) + x)
modern-bert's and gemma-embedding's are pre-norm (gemma: RMSNorms, and post-norms inside):
    x = x + post(attention(norm(x)));  x = x + post(FFN(norm(x)))   then a final norm
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.backend import Array, EncoderBackend
from edge_infer.models.encoder_config import EncoderConfig
from edge_infer.models.encoder_weights import EncoderLayer, EncoderWeights, Norm

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
        # the FFN buffers also hold gemma-embedding's dense_2 output (dense_3's input)
        wide = max(cfg.ffn_dim, weights.dense_2.rows if weights.dense_2 is not None else 0)
        self.ws = backend.make_workspace(capacity, cfg.d_model, cfg.q_dim, cfg.kv_dim, wide)
        self.eps = np.float32(cfg.norm_eps)
        self.scale = np.float32(1.0 / math.sqrt(cfg.head_dim))
        self.slopes = alibi_slopes(cfg.n_heads, cfg.alibi_max_bias)
        k = np.arange(cfg.n_rot // 2, dtype=np.float64)
        self.inv_freqs = [cfg.layer_rope_base(i) ** (-2.0 * k / max(cfg.n_rot, 1)) for i in range(cfg.n_layers)]
        # qkv_finish adds the biases, norms and rotates; a one-slot pool it never writes (slot -1)
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
        rows = (positions, seq_start, seq_end)
        if self.cfg.block == "pre_norm":
            return self._pre_norm_forward(tokens, rows, n)
        assert w.input_norm is not None
        b.embed(tokens, w.token_embd, np.float32(1.0), x)
        b.input_layernorm(x, w.type_row, w.positions, positions, w.input_norm.w, w.input_norm.b, self.eps, h)
        for i, lw in enumerate(w.layers):
            assert lw.attn_out_norm is not None and lw.out_norm is not None
            o = self._attention(i, lw, h, rows, n)
            b.add_layernorm(o, lw.bo, h, lw.attn_out_norm.w, lw.attn_out_norm.b, self.eps, ws.xn[:n])
            ffn_in = ws.xn[:n]
            if lw.norm_2 is not None:  # jina: the block's input added and normed once more
                b.add_layernorm(ws.xn[:n], _EMPTY, h, lw.norm_2.w, lw.norm_2.b, self.eps, ws.o2[:n])
                ffn_in = ws.o2[:n]
            o = ws.o[:n]
            b.matmuls(self._ffn_act(lw, ffn_in, n), (lw.w_down,), (o,), ws)
            b.add_layernorm(o, lw.b_down, ffn_in, lw.out_norm.w, lw.out_norm.b, self.eps, h)
        return h

    def _pre_norm_forward(self, tokens: Array, rows: tuple[Array, Array, Array], n: int) -> Array:
        b, ws, w, eps = self.b, self.ws, self.w, self.eps
        h, o, o2, xn = ws.h[:n], ws.o[:n], ws.o2[:n], ws.xn[:n]
        if w.input_norm is None:  # gemma: the embeddings scaled by sqrt(width)
            b.embed(tokens, w.token_embd, np.float32(self.cfg.embed_scale), h)
        else:
            b.embed(tokens, w.token_embd, np.float32(1.0), o)
            b.layernorm(o, w.input_norm.w, w.input_norm.b, eps, h)
        for i, lw in enumerate(w.layers):
            assert lw.ffn_norm is not None
            o = self._attention(i, lw, h if lw.attn_norm is None else self._norm(h, lw.attn_norm, xn), rows, n)
            if lw.post_attn_norm is not None:  # gemma: h += post(attention); xn = norm(h)
                assert lw.post_ffn_norm is not None
                b.rmsnorm(o, lw.post_attn_norm, eps, o2)
                b.add_rmsnorm(h, o2, lw.ffn_norm.w, eps, xn)
                b.matmuls(self._ffn_act(lw, xn, n), (lw.w_down,), (o,), ws)
                b.rmsnorm(o, lw.post_ffn_norm, eps, o2)
                b.add(h, o2)
            else:  # modern-bert: o = attention + h (the residual), h = FFN(norm(o)) + o
                b.add_layernorm(o, _EMPTY, h, lw.ffn_norm.w, lw.ffn_norm.b, eps, xn)
                b.matmuls(self._ffn_act(lw, xn, n), (lw.w_down,), (h,), ws)
                b.add(h, o)
        assert w.output_norm is not None
        return self._norm(h, w.output_norm, xn)

    def _norm(self, x: Array, norm: Norm, out: Array) -> Array:
        """A pre-norm block's norm of x into out (LayerNorm or RMSNorm by the config)."""
        if self.cfg.norm == "rms":
            self.b.rmsnorm(x, norm.w, self.eps, out)
        else:
            self.b.layernorm(x, norm.w, norm.b, self.eps, out)
        return out

    def _attention(self, i: int, lw: EncoderLayer, x: Array, rows: tuple[Array, Array, Array], n: int) -> Array:
        """Layer i's attention over x, through its output projection: ws.o."""
        cfg, b, ws, kv = self.cfg, self.b, self.ws, self.cfg.kv_dim
        positions, seq_start, seq_end = rows
        q, k, v = _rows(ws.q, n, cfg.q_dim), _rows(ws.k, n, kv), _rows(ws.v, n, kv)
        b.matmuls(x, (lw.wq, lw.wk, lw.wv), (q, k, v), ws)
        qn, kn = _or_empty(lw.q_head_norm), _or_empty(lw.k_head_norm)  # gemma's per-head RMSNorms
        b.qkv_finish(q, k, v, lw.bq, lw.bk, lw.bv, qn, kn, cfg.n_rot, positions, self.inv_freqs[i], 1.0, True,
                     self.eps, self._no_store[:n], self._no_kv)
        attn = _rows(ws.attn, n, cfg.q_dim)
        if lw.q_norm is not None:  # jina: LayerNorms of the whole Q and K rows (attention then writes o2)
            b.layernorm(q, lw.q_norm.w, lw.q_norm.b, self.eps, attn)
            q, attn = attn, ws.o2[:n]
        if lw.k_norm is not None:
            normed = _rows(ws.gate, n, kv)
            b.layernorm(k, lw.k_norm.w, lw.k_norm.b, self.eps, normed)
            k = normed
        b.encoder_attention(q, k, v, seq_start, seq_end, cfg.head_dim, self.scale, self.slopes, cfg.layer_window(i),
                            attn)
        b.matmuls(attn, (lw.wo,), (ws.o[:n],), ws)
        return ws.o[:n]

    def _ffn_act(self, lw: EncoderLayer, x: Array, n: int) -> Array:
        """The FFN's activation before its down projection (ws.act): GELU(up + b), or the
        gated SwiGLU / GELU (jina: up's bias added first)."""
        b, ws, f = self.b, self.ws, self.cfg.ffn_dim
        # the FFN buffers may be wider (gemma's dense_2): rows of exactly the FFN's width
        up, act = _rows(ws.up, n, f), _rows(ws.act, n, f)
        if lw.w_gate is None:  # bert: up (+ bias), GELU
            b.matmuls(x, (lw.w_up,), (up,), ws)
            b.bias_gelu(up, lw.b_up, act)
            return act
        gate = _rows(ws.gate, n, f)
        b.matmuls(x, (lw.w_gate, lw.w_up), (gate, up), ws)
        if self.cfg.ffn == "swiglu":
            b.silu_mul(gate, up, act)
        elif self.cfg.ffn == "reglu":
            b.relu_mul(gate, up, act)
        else:
            if lw.b_up.size:
                b.add(up, lw.b_up)
            b.gelu_mul(gate, up, act)
        return act

    def rank_head(self, pooled: np.ndarray) -> np.ndarray:
        """llama.cpp's rank pooling head over pooled rows float32 [B, D]: act(cls x + b) (tanh;
        modern-bert: GELU, then its norm), then the classifier cls_out (+ b) when the file has
        one -> float32 [B, n_out]."""
        w, b = self.w, self.b
        cur = np.ascontiguousarray(pooled, np.float32)
        if w.cls is not None:
            cur = self._project(cur, w.cls, w.cls_b)
            if self.cfg.cls_act == "gelu":
                act = np.empty_like(cur)
                b.bias_gelu(cur, _EMPTY, act)
                cur = act
            else:
                cur = np.tanh(cur)
            if w.cls_norm is not None:
                normed = np.empty_like(cur)
                b.layernorm(cur, w.cls_norm.w, w.cls_norm.b, self.eps, normed)
                cur = normed
        return self._project(cur, w.cls_out, w.cls_out_b) if w.cls_out is not None else cur

    def dense_out(self, pooled: np.ndarray) -> np.ndarray:
        """gemma-embedding's sentence-transformers projections of pooled rows (dense_2 + b, then
        dense_3), as llama.cpp's build_dense_out; rows unchanged without them."""
        w, cur = self.w, np.ascontiguousarray(pooled, np.float32)
        if w.dense_2 is not None:
            cur = self._project(cur, w.dense_2, w.dense_2_b)
        return self._project(cur, w.dense_3, _EMPTY) if w.dense_3 is not None else cur

    def _project(self, x: np.ndarray, m: QMatrix, bias: np.ndarray) -> np.ndarray:
        """x [B, K] @ m.T (+ bias) -> float32 [B, m.rows], in steps of up to `capacity` rows."""
        out = np.empty((x.shape[0], m.rows), np.float32)
        for i in range(0, x.shape[0], self.capacity):
            self.b.matmuls(x[i : i + self.capacity], (m,), (out[i : i + self.capacity],), self.ws)
        return out + bias if bias.size else out


def _or_empty(x: np.ndarray | None) -> np.ndarray:
    return _EMPTY if x is None else x
