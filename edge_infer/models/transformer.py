"""The decoder forward pass shared by every architecture (a mixture-of-experts FFN is moe.py's): a batch of tokens from any number
of sequences in, logits for the requested rows out. The switches of ModelConfig select the
variants (pre- and post-norms, QK-norms, multipliers, softcaps, per-layer RoPE tables). Every matmul sees all the step's tokens at
once (one pass over the weights); attention reads each sequence's keys through its block table.
All compute goes through the backend; all scratch is its preallocated workspace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_infer.models.altup import AltUp
from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.lora_set import LoraRows, LoraSet
from edge_infer.models.moe import moe_beside_dense, moe_ffn
from edge_infer.models.per_layer_input import PerLayerInput
from edge_infer.models.rope import MRope, layer_rope
from edge_infer.models.step_logits import StepLogits
from edge_infer.models.weights import ModelWeights, float_matrix

_EMPTY = np.empty(0, np.float32)
_NO_SLOTS = np.empty(0, np.int32)


def _or_empty(v: np.ndarray | None) -> np.ndarray:
    return _EMPTY if v is None else v


def _row_ids(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int32)


def _rows(buf: Any, n: int, width: int) -> Any:
    """n rows of `width` of a workspace buffer, contiguous (a layer narrower than the widest:
    gemma4's sliding-window layers have their own head size)."""
    return buf[:n] if buf.shape[1] == width else buf.reshape(-1)[: n * width].reshape(n, width)


@dataclass(slots=True)
class StepInputs:
    """One forward's token-level arguments (N tokens, S sequences, M logit rows).

    tokens, positions: int32 [N]; slot_mapping: int64 [N] KV slot of each token (block *
    block_size + offset); token_seq: int32 [N] row of block_tables for each token;
    block_tables: int32 [S, max_blocks]; logits_rows: int64 [M] token rows whose logits are
    returned, in that order; seq_slots: int32 [S] each sequence's state slot (hybrid models);
    snap_rows, snap_slots: int32 [P] after token row snap_rows[i] its state is copied into slot
    snap_slots[i] too (a snapshot for the prefix cache; rows ascending); images: (row, float32
    [r, d_model]) runs of rows whose input is an image's embeddings instead of their token's;
    attn_positions: int32 [N] the positions attention masks by, where they differ from positions
    (gemma3's image tokens see their whole image: the image's last position; [0]: positions);
    lora: each row's LoRA adapters (None: no row uses one); mrope: int32 [N, 3] each row's M-RoPE
    (t, h, w; engine/mrope.py) where an M-RoPE model runs with a projector ([0]: by positions).
    """

    tokens: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    token_seq: np.ndarray
    block_tables: np.ndarray
    logits_rows: np.ndarray
    seq_slots: np.ndarray = field(default_factory=lambda: _NO_SLOTS)
    snap_rows: np.ndarray = field(default_factory=lambda: _NO_SLOTS)
    snap_slots: np.ndarray = field(default_factory=lambda: _NO_SLOTS)
    images: tuple[tuple[int, np.ndarray], ...] = ()
    attn_positions: np.ndarray = field(default_factory=lambda: _NO_SLOTS)
    lora: LoraRows | None = None
    mrope: np.ndarray = field(default_factory=lambda: np.empty((0, 3), np.int32))


class Transformer:
    """Runs the layers of one model on a backend; owns no KV memory (it is passed in) and one
    workspace, made by the backend and grown when a step has more tokens than it holds.
    n_ctx: the longest sequence the engine allows (Phi-3's long rope factors apply above
    rope_orig_ctx); the model's context length when not given."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend, capacity: int = 256,
                 n_ctx: int | None = None) -> None:
        self.cfg, self.w, self.b = cfg, weights, backend
        self.rope = [layer_rope(cfg, layer, n_ctx or cfg.context_length) for layer in range(cfg.n_layers)]
        # float32 scalars made once (making one allocates)
        self.eps, self.scale = np.float32(cfg.norm_eps), np.float32(cfg.softmax_scale)
        self.embed_scale, self.softcap = np.float32(cfg.embed_scale), np.float32(cfg.final_logit_softcap)
        self.attn_softcap = np.float32(cfg.attn_softcap)
        self.residual_scale, self.inv_logit_scale = np.float32(cfg.residual_scale), np.float32(1.0 / cfg.logit_scale)
        self.k_head_of = np.array(cfg.delta_key_heads, np.int32)
        # qk_norm_after_rope's second pass: angles of zero rotate nothing (cos 1, sin 0: exact)
        self._no_rotation = np.zeros(cfg.n_rot // 2, np.float64)
        self._no_store = np.empty(0, np.int64)
        self.mrope = MRope(cfg.rope_sections)
        self.xielu = [tuple(np.float32(v) for v in p) for p in cfg.xielu]
        self.out_scale = [None if lw.out_scale is None else np.float32(lw.out_scale[0]) for lw in weights.layers]
        self.ple = PerLayerInput(cfg, weights, backend) if cfg.per_layer_input else None
        self.altup = AltUp(cfg, weights, backend, self.ple) if cfg.altup_streams and self.ple is not None else None
        self.sparsity = [np.float32(v) for v in cfg.sparsity]
        self._ones = np.ones(max(cfg.head_dim, cfg.head_dim_swa), np.float32)  # V's norm has no weight
        self.ws: Any = None
        self.lora: LoraSet | None = None  # the LoRA adapters loaded over this model (engine/lora.py)
        self._reserve(capacity)

    def _residual(self, h: np.ndarray, delta: np.ndarray, norm: np.ndarray | None, xn: np.ndarray) -> np.ndarray:
        """h += delta (times granite's residual multiplier); returns the next block's input: h
        normed into xn, or h itself where that block has no pre-norm (olmo2)."""
        if self.cfg.residual_scale != 1.0:
            self.b.scale(delta, self.residual_scale)
        if norm is None:
            self.b.add(h, delta)
            return h
        self.b.add_rmsnorm(h, delta, norm, self.eps, xn)
        return xn

    def _reserve(self, n_tokens: int) -> None:
        if self._no_store.shape[0] < n_tokens:  # slot -1: qkv_finish stores nothing
            self._no_store = np.full(max(n_tokens, 256), -1, np.int64)
        if self.ws is None or self.ws.capacity < n_tokens:
            cfg = self.cfg
            experts = (cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_dim) if cfg.n_experts else None
            self.ws = self.b.make_workspace(n_tokens, cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.dense_ffn_dim, experts,
                                            cfg.recurrent_widths, cfg.attn_output_gate, cfg.per_layer_input,
                                            (cfg.altup_streams, cfg.laurel_rank))

    def forward(self, inp: StepInputs, kv: list[Any], hidden: bool = False) -> np.ndarray:
        """Logits float32 [M, vocab] for inp.logits_rows, on the host; writes this step's K/V
        into `kv` (per layer: an attention layer's k_cache, k_scale, v_cache, v_scale, see
        kernels_cpu.attention; a recurrent layer's state pool, advanced past the step's tokens).
        hidden: return the final normed hidden states float32 [M, d_model] of those rows instead
        (what embeddings pool, llama.cpp's result_norm), without the output matmul."""
        m = inp.logits_rows.shape[0]
        return self.b.to_host(self._run(inp, kv, hidden)[:m], scratch=hidden)  # hidden: a copy, not scratch

    def forward_sampled(self, inp: StepInputs, kv: list[Any], whole: np.ndarray) -> StepLogits:
        """The logits of inp.logits_rows as the sampler reads them: whole on the host only where
        whole [M] bool is set, every row's argmax where the backend computes it."""
        m = inp.logits_rows.shape[0]
        return StepLogits(*self.b.read_logits(self._run(inp, kv, False)[:m], whole))

    def _run(self, inp: StepInputs, kv: list[Any], hidden: bool) -> Any:
        # every token's logits wanted (decode, verification): the backend may replay the step
        replayable = not hidden and inp.logits_rows.shape[0] == inp.tokens.shape[0]
        if inp.lora is None or self.lora is None:
            return self.b.run_step(inp, lambda dev: self._layers(dev, kv, hidden), replayable)
        # rows with adapters: this step's layers see the backend with the LoRA updates added
        base = self.b
        self.b = self.lora.backend.for_step(inp.lora, inp.tokens.shape[0], inp.logits_rows)  # type: ignore[assignment]
        try:
            return base.run_step(inp, lambda dev: self._layers(dev, kv, hidden), replayable)
        finally:
            self.b = base

    def _layers(self, inp: StepInputs, kv: list[Any], hidden: bool) -> Any:
        """The forward on the backend's copy of the inputs: the logits (or hidden states) as a
        backend array, not yet on the host."""
        cfg, eps, b = self.cfg, self.eps, self.b
        n, m = inp.tokens.shape[0], inp.logits_rows.shape[0]
        self._reserve(n)
        ws = self.ws
        h, xn, q = ws.h[:n], ws.xn[:n], ws.q[:n]
        attn, o, o2, gate, up, act = ws.attn[:n], ws.o[:n], ws.o2[:n], ws.gate[:n], ws.up[:n], ws.act[:n]
        # attention masks by attn_positions where given (RoPE always takes the true positions)
        attn_pos = inp.attn_positions if inp.attn_positions.shape[0] else inp.positions
        token_seq, positions = inp.token_seq, attn_pos
        b.embed(inp.tokens, self.w.token_embd, self.embed_scale, h)
        if inp.lora is not None and self.lora is not None and self.lora.embedding_tables:  # token_embd adapters
            self.lora.add_embedding(inp.tokens, inp.lora, self.embed_scale, h)
        for at, rows in inp.images:  # an image's embeddings go in as they are (llama.cpp scales only tokens)
            b.embed(_row_ids(rows.shape[0]), float_matrix(rows, "image"), np.float32(1.0), h[at : at + rows.shape[0]])
        if self.ple is not None:
            b.embed(inp.tokens, self.w.token_embd, self.embed_scale, ws.x0[:n])
            self.ple.start(inp.tokens)
        if self.altup is not None:  # gemma3n: the layer runs on stream 0's prediction
            self.altup.start(inp.tokens, h, ws)
        x = h
        if self.w.layers[0].attn_norm is not None:
            b.rmsnorm(h, self.w.layers[0].attn_norm, eps, xn)
            x = xn
        for li, lw in enumerate(self.w.layers):
            # (gemma3n's last layer runs on every token: its AltUp streams are merged after it)
            last = li == cfg.n_layers - 1 and m < n and self.altup is None
            next_norm = self.w.layers[li + 1].attn_norm if li + 1 < cfg.n_layers else self.w.output_norm
            router_logits = None
            if cfg.router_on_input and lw.experts is not None:  # smallthinker: routes the layer's input
                router_logits = ws.moe.logits_in[:n]
                b.matmuls(h, (lw.experts.router,), (router_logits,), ws)
            if not cfg.has_mixer(li):  # nemotron_h's FFN layer: attn_norm is the FFN's pre-norm
                if last:
                    b.take_rows(h, inp.logits_rows, ws.h_rows[:m])
                    b.take_rows(x, inp.logits_rows, ws.xn_rows[:m])
                    h, xn = ws.h_rows[:m], ws.xn_rows[:m]
                    x, o, o2, gate, up, act = xn, o[:m], o2[:m], gate[:m], up[:m], act[:m]
            elif cfg.is_recurrent(li) and not cfg.parallel_ssm:
                block = self._short_conv if lw.conv is not None else self._mamba2 if lw.ssm is not None else self._gated_delta
                mixed = block(x, lw, kv[li], inp, o)
                if last:  # the block ran on every token (its state); the rest only on the wanted rows
                    b.take_rows(o, inp.logits_rows, ws.o_rows[:m])
                    b.take_rows(h, inp.logits_rows, ws.h_rows[:m])
                    mixed, h, xn = ws.o_rows[:m], ws.h_rows[:m], ws.xn_rows[:m]
                    o, o2, gate, up, act = o[:m], o2[:m], gate[:m], up[:m], act[:m]
            else:
                assert lw.wq is not None and lw.wo is not None
                layer_kv, ssm_out = kv[li], None
                if cfg.parallel_ssm:  # falcon-h1: Mamba2 beside attention, on the same normed input
                    layer_kv, states = kv[li]
                    ssm_out = self._mamba2(x, lw, states, inp, o2)
                laurel = None if self.altup is None else self.altup.laurel(lw, x, ws)  # gemma3n, beside attention
                q_dim = cfg.n_heads * cfg.layer_head_dim(li)
                q, attn, qgate = _rows(ws.q, n, q_dim), _rows(ws.attn, n, q_dim), ws.q_gate[:n]
                self._qkv(li, lw, x, q, qgate, inp, layer_kv)
                if last:
                    # Last layer: K/V of every token are stored; the rest is only needed for the
                    # rows whose logits are wanted (llama.cpp's inp_out_ids does the same).
                    sel = inp.logits_rows
                    b.take_rows(q, sel, _rows(ws.q_rows, m, q_dim))
                    b.take_rows(h, sel, ws.h_rows[:m])
                    b.take_rows(inp.token_seq, sel, ws.seq_rows[:m])
                    b.take_rows(attn_pos, sel, ws.pos_rows[:m])
                    if cfg.attn_output_gate:
                        b.take_rows(qgate, sel, ws.q_gate_rows[:m])
                        qgate = ws.q_gate_rows[:m]
                    if ssm_out is not None:
                        b.take_rows(ssm_out, sel, ws.o_rows[:m])
                        ssm_out = ws.o_rows[:m]
                    if router_logits is not None:
                        b.take_rows(router_logits, sel, ws.moe.logits[:m])
                        router_logits = ws.moe.logits[:m]
                    q, h, xn = _rows(ws.q_rows, m, q_dim), ws.h_rows[:m], ws.xn_rows[:m]
                    token_seq, positions = ws.seq_rows[:m], ws.pos_rows[:m]
                    attn, o, o2, gate, up, act = attn[:m], o[:m], o2[:m], gate[:m], up[:m], act[:m]
                b.attention(q, layer_kv, inp.block_tables, token_seq, positions, self.scale, cfg.layer_window(li),
                            self.attn_softcap, attn, _or_empty(lw.sinks))  # sinks: gpt-oss's, else none
                if cfg.attn_output_gate:
                    b.sigmoid_mul(attn, qgate)
                b.matmuls(attn, (lw.wo,), (o,), ws)
                if lw.bo is not None:
                    b.add(o, lw.bo)
                if ssm_out is not None:
                    b.add(o, ssm_out)
                mixed = o
            if cfg.has_mixer(li):
                if lw.post_attn_norm is not None:
                    b.rmsnorm(mixed, lw.post_attn_norm, eps, o2)
                ffn_norm = lw.ffn_norm if cfg.has_ffn(li) else next_norm
                if self.altup is not None:
                    x = self.altup.merge_attention(h, o2, laurel, ffn_norm, xn)
                else:
                    x = self._residual(h, mixed if lw.post_attn_norm is None else o2, ffn_norm, xn)
                if not cfg.has_ffn(li):  # nemotron_h's attention and Mamba2 layers
                    continue
            ffn_out = self._ffn(li, lw, h, x, o, gate, up, act, router_logits)
            if lw.post_ffn_norm is not None:
                b.rmsnorm(ffn_out, lw.post_ffn_norm, eps, o2)
            if self.ple is None and lw.out_scale is None:
                x = self._residual(h, ffn_out if lw.post_ffn_norm is None else o2, next_norm, xn)
                continue
            # gemma4: the per-layer input and the layer's output scale come after the FFN's add;
            # gemma3n: AltUp's correction (with the per-layer input) and the next prediction
            b.add(h, ffn_out if lw.post_ffn_norm is None else o2)
            if self.altup is not None:
                self.altup.end_layer(li, lw, h, ws)
            elif self.ple is not None:
                self.ple.add(li, lw, h, inp.logits_rows if last else None, ws, eps)
            if (s := self.out_scale[li]) is not None:
                b.scale(h, s)
            assert next_norm is not None
            b.rmsnorm(h, next_norm, eps, xn)
            x = xn
        if self.altup is not None and m < n:
            b.take_rows(x, inp.logits_rows, ws.xn_rows[:m])
            x = ws.xn_rows[:m]
        if hidden:
            return x[:m]
        logits = b.output_buffer(m, cfg.vocab_size)  # handed to the caller: not scratch
        b.matmuls(x, (self.w.output,), (logits,), ws)
        if cfg.final_logit_softcap:
            b.softcap(logits, self.softcap)
        if cfg.logit_scale != 1.0:
            b.scale(logits, self.inv_logit_scale)
        return logits

    def _qkv(self, li: int, lw: Any, x: Any, q: Any, qgate: Any, inp: StepInputs, layer_kv: Any) -> None:
        """Layer li's Q (into q; qwen35's output gate into qgate) with biases, norms and RoPE,
        and its K/V into the pool: all but gemma4's KV-shared layers (no wk), whose Q attends
        over an earlier layer's K/V."""
        cfg, b, ws, eps, n = self.cfg, self.b, self.ws, self.eps, x.shape[0]
        hd, n_rot = cfg.layer_head_dim(li), cfg.layer_n_rot(li)
        kv_dim = cfg.layer_kv_heads(li) * hd
        k, v, store = _rows(ws.k, n, kv_dim), _rows(ws.v, n, kv_dim), inp.slot_mapping
        inv_freq, mscale = self.rope[li]
        if lw.wk is None:
            b.matmuls(x, (lw.wq,), (q,), ws)
            k, v, store = ws.no_out[:n], ws.no_out[:n], self._no_store[:n]
        elif cfg.attn_output_gate:  # qwen35: [q | gate] per head
            b.matmuls(x, (lw.wq, lw.wk, lw.wv), (ws.qg[:n], k, v), ws)
            b.split_gated_q(ws.qg[:n], cfg.head_dim, q, qgate)
        elif lw.wv is None:  # gemma4's K = V layers
            b.matmuls(x, (lw.wq, lw.wk), (q, k), ws)
        else:
            b.matmuls(x, (lw.wq, lw.wk, lw.wv), (q, k, v), ws)
        if cfg.v_norm and lw.wk is not None:  # gemma4: V (or K's projection) RMS-normed per head, no weight
            heads, normed = n * cfg.layer_kv_heads(li), _rows(ws.attn, n, kv_dim)  # attn is free until attention
            b.rmsnorm((k if lw.wv is None else v).reshape(heads, hd), self._ones[:hd], eps, normed.reshape(heads, hd))
            v = normed
        if inp.mrope.shape[0]:  # M-RoPE with images: biases and norms, the rotation on the host, the K/V store
            b.qkv_finish(q, k, v, _or_empty(lw.bq), _or_empty(lw.bk), _or_empty(lw.bv), _or_empty(lw.q_norm),
                         _or_empty(lw.k_norm), n_rot, inp.positions, self._no_rotation, 1.0, cfg.rope_neox, eps,
                         self._no_store[:n], layer_kv)
            self.mrope.rotate((q, k), hd, n_rot, inv_freq, mscale, inp.mrope)
            b.qkv_finish(q, k, v, _EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY, n_rot, inp.positions, self._no_rotation,
                         1.0, cfg.rope_neox, eps, store, layer_kv)
        elif cfg.qk_norm_after_rope:  # hunyuan-dense: biases and RoPE, then the norms and the K/V store
            b.qkv_finish(q, k, v, _or_empty(lw.bq), _or_empty(lw.bk), _or_empty(lw.bv), _EMPTY, _EMPTY,
                         n_rot, inp.positions, inv_freq, mscale, cfg.rope_neox, eps, self._no_store[:n], layer_kv)
            b.qkv_finish(q, k, v, _EMPTY, _EMPTY, _EMPTY, _or_empty(lw.q_norm), _or_empty(lw.k_norm), n_rot,
                         inp.positions, self._no_rotation, 1.0, cfg.rope_neox, eps, store, layer_kv)
        else:
            b.qkv_finish(q, k, v, _or_empty(lw.bq), _or_empty(lw.bk), _or_empty(lw.bv), _or_empty(lw.q_norm),
                         _or_empty(lw.k_norm), n_rot, inp.positions, inv_freq, mscale, cfg.rope_neox, eps, store,
                         layer_kv)

    def _ffn(self, li: int, lw: Any, h: Any, x: Any, out: Any, gate: Any, up: Any, act: Any,
             router_logits: Any) -> Any:
        """Layer li's FFN of x (h through the FFN's pre-norm) into `out` (returned; gemma4's
        experts beside its MLP return x's buffer): the mixture of experts (router_logits: computed
        already), SwiGLU / GeGLU, or an ungated one: nemotron_h's relu(up x)^2, apertus's xIELU(up x)."""
        cfg, b, ws = self.cfg, self.b, self.ws
        if lw.experts is not None and cfg.moe_beside_dense:
            return moe_beside_dense(b, cfg, lw, h, x, out, ws)
        if lw.experts is not None:
            moe_ffn(b, cfg, lw, x, out, ws, router_logits)
            return out
        if cfg.layer_ffn_dims:  # gemma4: the KV-shared layers' MLP is twice as wide
            n, ff = x.shape[0], cfg.layer_ffn_dim(li)
            gate, up, act = _rows(ws.gate, n, ff), _rows(ws.up, n, ff), _rows(ws.act, n, ff)
        assert lw.w_up is not None and lw.w_down is not None
        if cfg.activation in ("relu2", "xielu"):
            b.matmuls(x, (lw.w_up,), (up,), ws)
            if cfg.activation == "relu2":
                b.relu_sqr(up, act)
            else:
                alpha_n, alpha_p, beta, eps = self.xielu[li]
                b.xielu(up, alpha_n, alpha_p, beta, eps, act)
        else:
            assert lw.w_gate is not None
            b.matmuls(x, (lw.w_gate, lw.w_up), (gate, up), ws)
            if self.sparsity and self.sparsity[li]:  # gemma3n: only the gate values far above the mean
                b.gaussian_topk(gate, self.sparsity[li])
            (b.gelu_mul if cfg.activation == "gelu" else b.silu_mul)(gate, up, act)
        b.matmuls(act, (lw.w_down,), (out,), ws)
        return out

    def _short_conv(self, x: Any, lw: Any, states: Any, inp: StepInputs, out: Any) -> Any:
        """LFM2's short-convolution block on every token of the step: in_proj to [b | c | x],
        c * conv(b * x) with each sequence's state, out_proj into `out` (returned)."""
        b, ws, n, d = self.b, self.ws, x.shape[0], self.cfg.d_model
        bcx, y = ws.rec_in[:n, : 3 * d], ws.rec_y[:n, :d]
        b.matmuls(x, (lw.in_proj,), (bcx,), ws)
        b.short_conv(bcx, lw.conv, states[0], inp.seq_slots, inp.token_seq, inp.positions, inp.snap_rows,
                     inp.snap_slots, y)
        b.matmuls(y, (lw.out_proj,), (out,), ws)
        return out

    def _mamba2(self, x: Any, lw: Any, states: Any, inp: StepInputs, out: Any) -> Any:
        """A Mamba2 block on every token of the step (llama.cpp's build_mamba2_layer): in_proj to
        [z | x B C | dt], silu(conv(x B C) + bias), the selective scan + D x, rmsnorm per group
        of y * silu(z), out_proj into `out` (returned)."""
        cfg, b, ws, n, m = self.cfg, self.b, self.ws, x.shape[0], lw.ssm
        e, c = cfg.ssm_inner, cfg.ssm_conv_dim
        zxdt, xbc = ws.rec_in[:n, : 2 * e + 2 * cfg.ssm_groups * cfg.ssm_state + cfg.ssm_heads], ws.rec_mid[:n, :c]
        y, g = ws.rec_y[:n, :e], ws.rec_out[:n, :e]
        conv_state, scan_state = states
        b.matmuls(x, (lw.in_proj,), (zxdt,), ws)
        b.conv_silu(zxdt, e, m.conv, m.conv_bias, conv_state, inp.seq_slots, inp.token_seq, inp.positions,
                    inp.snap_rows, inp.snap_slots, xbc)
        b.ssm_scan(xbc, zxdt, e + c, m.dt_bias, m.a, m.d, scan_state, inp.seq_slots, inp.token_seq, inp.positions,
                   inp.snap_rows, inp.snap_slots, y)
        b.gated_group_rmsnorm(y, zxdt, m.norm, cfg.ssm_groups, self.eps, g)
        b.matmuls(g, (lw.out_proj,), (out,), ws)
        return out

    def _gated_delta(self, x: Any, lw: Any, states: Any, inp: StepInputs, out: Any) -> Any:
        """A Gated DeltaNet block on every token of the step (llama.cpp's qwen35
        build_layer_attn_linear): the q k v projection, silu(conv), the delta rule, an RMSNorm
        per head times silu(z), out_proj into `out` (returned)."""
        cfg, b, ws, n, dw = self.cfg, self.b, self.ws, x.shape[0], lw.delta
        c, v = cfg.ssm_conv_dim, cfg.ssm_inner
        qkv, conv, y, g = ws.rec_in[:n, :c], ws.rec_mid[:n, :c], ws.rec_y[:n, :v], ws.rec_out[:n, :v]
        z, beta, alpha = ws.rec_z[:n, :v], ws.rec_beta[:n, : cfg.ssm_heads], ws.rec_alpha[:n, : cfg.ssm_heads]
        conv_state, rule_state = states
        b.matmuls(x, (lw.in_proj, dw.z, dw.beta), (qkv, z, beta), ws)
        b.matmuls(x, (dw.alpha,), (alpha,), ws)
        b.conv_silu(qkv, 0, dw.conv, dw.conv_bias, conv_state, inp.seq_slots, inp.token_seq, inp.positions,
                    inp.snap_rows, inp.snap_slots, conv)
        b.delta_rule(conv, beta, alpha, dw.dt_bias, dw.a, rule_state, inp.seq_slots, inp.token_seq, inp.positions,
                     inp.snap_rows, inp.snap_slots, self.k_head_of, self.eps, y)
        b.head_rmsnorm_gate(y, z, dw.norm, self.eps, g)
        b.matmuls(g, (lw.out_proj,), (out,), ws)
        return out
