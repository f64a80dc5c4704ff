"""The scratch memory of one forward pass, preallocated (llama2.c's RunState): every buffer a
named field, so a decode step allocates no per-layer arrays. Buffers hold `capacity` tokens;
a step of n tokens uses their first n rows (views).

Both backends build it the same way: a table of each field's (shape, dtype) by name
(workspace_shapes, expert_shapes), handed with the backend's allocator to `allocate`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

Shape = tuple[tuple[int, ...], type]  # (shape, numpy dtype) of one buffer
Empty = Callable[[tuple[int, ...], type], Any]  # an allocator like np.empty(shape, dtype): no zeroing


@dataclass(slots=True)
class Workspace:
    """T = capacity tokens; D model width, Q = n_heads * head_dim, KV = n_kv_heads * head_dim,
    F FFN width, K_max = max(D, Q, F) the widest matmul input."""

    capacity: int
    h: np.ndarray  # f32 [T, D] the residual stream
    xn: np.ndarray  # f32 [T, D] the normed input of the next matmuls
    q: np.ndarray  # f32 [T, Q]
    k: np.ndarray  # f32 [T, KV]
    v: np.ndarray  # f32 [T, KV]
    attn: np.ndarray  # f32 [T, Q] attention output
    o: np.ndarray  # f32 [T, D] attention output projection, then the FFN's down projection
    o2: np.ndarray  # f32 [T, D] o after a post-norm (gemma)
    gate: np.ndarray  # f32 [T, F]
    up: np.ndarray  # f32 [T, F]
    act: np.ndarray  # f32 [T, F] the gated activation
    q_rows: np.ndarray  # f32 [T, Q] last layer: q of the rows whose logits are wanted
    h_rows: np.ndarray  # f32 [T, D] last layer: h of those rows
    xn_rows: np.ndarray  # f32 [T, D] last layer: xn of those rows
    seq_rows: np.ndarray  # i32 [T] last layer: token_seq of those rows
    pos_rows: np.ndarray  # i32 [T] last layer: positions of those rows
    o_rows: np.ndarray  # f32 [T, D] last layer: a recurrent block's output of those rows
    # a recurrent block's scratch (ModelConfig.recurrent_widths; width 0 without): its in_proj
    # output (LFM2 [b | c | x], Mamba2 [z | x B C | dt]), Mamba2's convolved [x | B | C], the
    # block's output before out_proj (LFM2's gated convolution, Mamba2's scan), Mamba2's gated norm
    rec_in: np.ndarray
    rec_mid: np.ndarray
    rec_y: np.ndarray
    rec_out: np.ndarray
    rec_z: np.ndarray  # f32 [T, V] the delta rule's output gate (V value width)
    rec_beta: np.ndarray  # f32 [T, H] its per-head beta and alpha projections
    rec_alpha: np.ndarray
    # gated attention (qwen35; width 0 without): Q's projection [q | gate] per head, the gate, its rows
    qg: np.ndarray  # f32 [T, 2Q]
    q_gate: np.ndarray  # f32 [T, Q]
    q_gate_rows: np.ndarray  # f32 [T, Q]
    xq4: np.ndarray  # i32 [T * K_max / 4] int8 activation codes, 4 per int32 (viewed [n, K/4])
    xd: np.ndarray  # f32 [T * K_max / 32] activation block scales (viewed [n, K/32])
    xsum: np.ndarray  # i32 [T * K_max / 32] activation block sums (viewed [n, K/32])
    xs16: np.ndarray  # i32 [T * K_max / 16] K-quant activation sums per 16 (viewed [n, K/16])
    no_out: np.ndarray  # f32 [T, 0] the output of an unused matrix slot in a fused launch
    # per-layer embedding inputs (gemma4; width 0 without): the scaled token embeddings the
    # model started from [T, D], and [T, P] scratch of a layer's input, its gate and activation
    x0: np.ndarray
    ple_in: np.ndarray
    ple_gate: np.ndarray
    ple_act: np.ndarray
    ple_rows: np.ndarray
    # gemma3n (sizes 0 without): its A AltUp streams and their predictions [A, T, D], the router's
    # output [T, A], LAuReL's output [T, D] and its rank-R bottleneck [T, R]
    alt_streams: np.ndarray
    alt_pred: np.ndarray
    alt_r: np.ndarray
    laurel: np.ndarray
    laurel_low: np.ndarray
    moe: ExpertWorkspace | None = None  # mixture-of-experts layers' buffers

    @classmethod
    def allocate(cls, empty: Empty, capacity: int, shapes: dict[str, Shape],
                 moe: ExpertWorkspace | None = None) -> Workspace:
        """Every buffer field by name from `shapes` (workspace_shapes), each made by `empty`."""
        return cls(capacity=capacity, moe=moe, **_buffers(cls, empty, shapes, {"capacity", "moe"}))


@dataclass(slots=True)
class ExpertWorkspace:
    """A mixture-of-experts FFN's buffers: T tokens, E experts, k chosen per token, P = T * k
    (token, expert) pairs in expert-grouped order (kernels_cpu.moe), D model width, Fe an
    expert's FFN width, K_max = max(D, Fe)."""

    logits: np.ndarray  # f32 [T, E] router logits
    logits_in: np.ndarray  # f32 [T, E] router logits of the layer's input, before its block (smallthinker)
    sel: np.ndarray  # i32 [T, k] chosen experts
    wts: np.ndarray  # f32 [T, k] their weights
    pair_of: np.ndarray  # i32 [T, k] the pair row of each (token, choice)
    offsets: np.ndarray  # i32 [E + 1] expert e's pairs are rows offsets[e]..offsets[e + 1] - 1
    pair_token: np.ndarray  # i32 [P] the token of each pair
    xg: np.ndarray  # f32 [P, D] the FFN input of each pair's token
    gate: np.ndarray  # f32 [P, Fe]
    up: np.ndarray  # f32 [P, Fe]
    act: np.ndarray  # f32 [P, Fe]
    y: np.ndarray  # f32 [P, D] each pair's expert output
    xq4: np.ndarray  # i32 [P * K_max / 4] the pairs' int8 activation codes (viewed [P, K/4])
    xd: np.ndarray  # f32 [P * K_max / 32]
    xsum: np.ndarray  # i32 [P * K_max / 32]
    xs16: np.ndarray  # i32 [P * K_max / 16]

    @classmethod
    def allocate(cls, empty: Empty, shapes: dict[str, Shape]) -> ExpertWorkspace:
        """Every field by name from `shapes` (expert_shapes), each made by `empty`."""
        return cls(**_buffers(cls, empty, shapes, set()))


def _buffers(cls: type, empty: Empty, shapes: dict[str, Shape], other: set[str]) -> dict[str, Any]:
    # The table must name exactly the buffer fields, so a field added to the class without a
    # shape (or a stale name in a backend's table) fails here, by name, not as a missing argument.
    names = [f.name for f in fields(cls) if f.name not in other]
    if set(shapes) != set(names):
        missing, extra = sorted(set(names) - set(shapes)), sorted(set(shapes) - set(names))
        raise ValueError(f"{cls.__name__} shapes: missing {missing}, unknown {extra}")
    return {name: empty(*shapes[name]) for name in names}


def workspace_shapes(capacity: int, d_model: int, q_dim: int, kv_dim: int, ffn_dim: int,
                     per_row: bool = False, recurrent: tuple[int, ...] = (0, 0, 0, 0, 0),
                     gated_attention: bool = False, per_layer: int = 0,
                     altup: tuple[int, int] = (0, 0)) -> dict[str, Shape]:
    """Each Workspace buffer's (shape, dtype) for steps of up to `capacity` tokens. The
    activation-code buffers (xq4, xd, xsum, xs16) are flat [T * K_max / g], viewed as a
    contiguous [n, K/g] per matmul (i8_views, k_views), or with per_row [T, K_max / g], sliced
    [:n, :K/g] per launch (the CUDA kernels index rows and columns). recurrent: a hybrid
    model's ModelConfig.recurrent_widths; gated_attention: ModelConfig.attn_output_gate;
    per_layer: ModelConfig.per_layer_input; altup: gemma3n's (streams, LAuReL rank)."""
    t, f32, i32 = capacity, np.float32, np.int32
    rec_in, rec_mid, rec_y, rec_z, rec_h = recurrent
    gq = q_dim if gated_attention else 0
    k_max = max(d_model, q_dim, ffn_dim, rec_y, per_layer)
    n_alt, rank = altup
    alt_d = d_model if n_alt else 0

    def codes(group: int) -> tuple[int, ...]:
        return (t, k_max // group) if per_row else (t * k_max // group,)

    return {
        "h": ((t, d_model), f32), "xn": ((t, d_model), f32), "q": ((t, q_dim), f32),
        "k": ((t, kv_dim), f32), "v": ((t, kv_dim), f32), "attn": ((t, q_dim), f32),
        "o": ((t, d_model), f32), "o2": ((t, d_model), f32), "gate": ((t, ffn_dim), f32),
        "up": ((t, ffn_dim), f32), "act": ((t, ffn_dim), f32), "q_rows": ((t, q_dim), f32),
        "h_rows": ((t, d_model), f32), "xn_rows": ((t, d_model), f32), "seq_rows": ((t,), i32),
        "pos_rows": ((t,), i32), "o_rows": ((t, d_model), f32), "rec_in": ((t, rec_in), f32),
        "rec_mid": ((t, rec_mid), f32), "rec_y": ((t, rec_y), f32), "rec_out": ((t, rec_y if rec_mid else 0), f32),
        "rec_z": ((t, rec_z), f32), "rec_beta": ((t, rec_h), f32), "rec_alpha": ((t, rec_h), f32),
        "qg": ((t, 2 * gq), f32), "q_gate": ((t, gq), f32), "q_gate_rows": ((t, gq), f32), "xq4": (codes(4), i32), "xd": (codes(32), f32),
        "xsum": (codes(32), i32), "xs16": (codes(16), i32), "no_out": ((t, 0), f32),
        "x0": ((t, d_model if per_layer else 0), f32), "ple_in": ((t, per_layer), f32),
        "ple_gate": ((t, per_layer), f32), "ple_act": ((t, per_layer), f32), "ple_rows": ((t, per_layer), f32),
        "alt_streams": ((n_alt, t, alt_d), f32), "alt_pred": ((n_alt, t, alt_d), f32), "alt_r": ((t, n_alt), f32),
        "laurel": ((t, alt_d), f32), "laurel_low": ((t, rank), f32),
    }


def expert_shapes(capacity: int, d_model: int, n_experts: int, n_used: int, expert_ffn: int) -> dict[str, Shape]:
    """Each ExpertWorkspace buffer's (shape, dtype) for steps of up to `capacity` tokens, each
    choosing `n_used` of `n_experts` experts of FFN width `expert_ffn`."""
    t, p, f32, i32 = capacity, capacity * n_used, np.float32, np.int32
    k_max = max(d_model, expert_ffn)
    return {
        "logits": ((t, n_experts), f32), "logits_in": ((t, n_experts), f32), "sel": ((t, n_used), i32), "wts": ((t, n_used), f32),
        "pair_of": ((t, n_used), i32), "offsets": ((n_experts + 1,), i32), "pair_token": ((p,), i32),
        "xg": ((p, d_model), f32), "gate": ((p, expert_ffn), f32), "up": ((p, expert_ffn), f32),
        "act": ((p, expert_ffn), f32), "y": ((p, d_model), f32), "xq4": ((p * k_max // 4,), i32),
        "xd": ((p * k_max // 32,), f32), "xsum": ((p * k_max // 32,), i32), "xs16": ((p * k_max // 16,), i32),
    }


def make_workspace(capacity: int, d_model: int, q_dim: int, kv_dim: int, ffn_dim: int,
                   experts: tuple[int, int, int] | None = None, recurrent: tuple[int, ...] = (0, 0, 0, 0, 0),
                   gated_attention: bool = False, per_layer: int = 0,
                   altup: tuple[int, int] = (0, 0)) -> Workspace:
    """Host buffers for steps of up to `capacity` tokens; experts: (E, k, Fe) of a
    mixture-of-experts model; recurrent, gated_attention, per_layer, altup: see workspace_shapes."""
    moe = ExpertWorkspace.allocate(np.empty, expert_shapes(capacity, d_model, *experts)) if experts else None
    shapes = workspace_shapes(capacity, d_model, q_dim, kv_dim, ffn_dim, recurrent=recurrent,
                              gated_attention=gated_attention, per_layer=per_layer, altup=altup)
    return Workspace.allocate(np.empty, capacity, shapes, moe)


def make_expert_workspace(capacity: int, d_model: int, n_experts: int, n_used: int, expert_ffn: int) -> ExpertWorkspace:
    """Host buffers of a mixture-of-experts FFN (expert_shapes)."""
    return ExpertWorkspace.allocate(np.empty, expert_shapes(capacity, d_model, n_experts, n_used, expert_ffn))


def i8_views(ws: Workspace | ExpertWorkspace, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for n x k activations in the int8 kernel's form (see i8_activation_buffers), as
    contiguous views of the workspace."""
    return ws.xq4[: n * k // 4].reshape(n, k // 4), ws.xd[: n * k // 32].reshape(n, k // 32), ws.xsum[: n * k // 32].reshape(n, k // 32)


def k_views(ws: Workspace | ExpertWorkspace, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for n x k activations in the K-quant kernel's form (xq4 [n, K/4], xd [n, K/32],
    xs16 [n, K/16]; kernels_cpu.matmul_k), as contiguous views of the workspace."""
    return (ws.xq4[: n * k // 4].reshape(n, k // 4), ws.xd[: n * k // 32].reshape(n, k // 32),
            ws.xs16[: n * k // 16].reshape(n, k // 16))


def i8_activation_buffers(t: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for T x K activations in the int8 kernel's form: xq4 int32 [T, K/4] (int8 codes
    packed 4 per int32), xd float32 [T, K/32] block scales, xsum int32 [T, K/32] block sums."""
    return np.empty((t, k // 4), np.int32), np.empty((t, k // 32), np.float32), np.empty((t, k // 32), np.int32)
