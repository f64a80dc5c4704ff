"""The scratch memory of one forward pass, preallocated (llama2.c's RunState): every buffer a
named field, so a decode step allocates no per-layer arrays. Buffers hold `capacity` tokens;
a step of n tokens uses their first n rows (views)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    xq4: np.ndarray  # i32 [T * K_max / 4] int8 activation codes, 4 per int32 (viewed [n, K/4])
    xd: np.ndarray  # f32 [T * K_max / 32] activation block scales (viewed [n, K/32])
    xsum: np.ndarray  # i32 [T * K_max / 32] activation block sums (viewed [n, K/32])
    xs16: np.ndarray  # i32 [T * K_max / 16] K-quant activation sums per 16 (viewed [n, K/16])
    no_out: np.ndarray  # f32 [T, 0] the output of an unused matrix slot in a fused launch
    moe: ExpertWorkspace | None = None  # mixture-of-experts layers' buffers


@dataclass(slots=True)
class ExpertWorkspace:
    """A mixture-of-experts FFN's buffers: T tokens, E experts, k chosen per token, P = T * k
    (token, expert) pairs in expert-grouped order (kernels_cpu.moe), D model width, Fe an
    expert's FFN width, K_max = max(D, Fe)."""

    logits: np.ndarray  # f32 [T, E] router logits
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


def make_workspace(capacity: int, d_model: int, q_dim: int, kv_dim: int, ffn_dim: int,
                   experts: tuple[int, int, int] | None = None) -> Workspace:
    """Buffers for steps of up to `capacity` tokens; experts: (E, k, Fe) of a mixture-of-experts
    model."""
    t = capacity
    f32 = np.float32
    k_max = max(d_model, q_dim, ffn_dim)
    moe = make_expert_workspace(capacity, d_model, *experts) if experts else None
    return Workspace(
        t, np.empty((t, d_model), f32), np.empty((t, d_model), f32), np.empty((t, q_dim), f32),
        np.empty((t, kv_dim), f32), np.empty((t, kv_dim), f32), np.empty((t, q_dim), f32),
        np.empty((t, d_model), f32), np.empty((t, d_model), f32), np.empty((t, ffn_dim), f32),
        np.empty((t, ffn_dim), f32), np.empty((t, ffn_dim), f32), np.empty((t, q_dim), f32),
        np.empty((t, d_model), f32), np.empty((t, d_model), f32), np.empty(t, np.int32), np.empty(t, np.int32),
        np.empty(t * k_max // 4, np.int32), np.empty(t * k_max // 32, f32), np.empty(t * k_max // 32, np.int32),
        np.empty(t * k_max // 16, np.int32), np.empty((t, 0), f32), moe,
    )


def make_expert_workspace(capacity: int, d_model: int, n_experts: int, n_used: int, expert_ffn: int) -> ExpertWorkspace:
    t, p, f32, i32 = capacity, capacity * n_used, np.float32, np.int32
    k_max = max(d_model, expert_ffn)
    return ExpertWorkspace(
        np.empty((t, n_experts), f32), np.empty((t, n_used), i32), np.empty((t, n_used), f32),
        np.empty((t, n_used), i32), np.empty(n_experts + 1, i32), np.empty(p, i32), np.empty((p, d_model), f32),
        np.empty((p, expert_ffn), f32), np.empty((p, expert_ffn), f32), np.empty((p, expert_ffn), f32),
        np.empty((p, d_model), f32), np.empty(p * k_max // 4, i32), np.empty(p * k_max // 32, f32),
        np.empty(p * k_max // 32, i32), np.empty(p * k_max // 16, i32),
    )


def i8_views(ws: Workspace, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for n x k activations in the int8 kernel's form (see i8_activation_buffers), as
    contiguous views of the workspace."""
    return ws.xq4[: n * k // 4].reshape(n, k // 4), ws.xd[: n * k // 32].reshape(n, k // 32), ws.xsum[: n * k // 32].reshape(n, k // 32)


def k_views(ws: Workspace, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for n x k activations in the K-quant kernel's form (xq4 [n, K/4], xd [n, K/32],
    xs16 [n, K/16]; kernels_cpu.matmul_k), as contiguous views of the workspace."""
    return (ws.xq4[: n * k // 4].reshape(n, k // 4), ws.xd[: n * k // 32].reshape(n, k // 32),
            ws.xs16[: n * k // 16].reshape(n, k // 16))


def i8_activation_buffers(t: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Room for T x K activations in the int8 kernel's form: xq4 int32 [T, K/4] (int8 codes
    packed 4 per int32), xd float32 [T, K/32] block scales, xsum int32 [T, K/32] block sums."""
    return np.empty((t, k // 4), np.int32), np.empty((t, k // 32), np.float32), np.empty((t, k // 32), np.int32)
