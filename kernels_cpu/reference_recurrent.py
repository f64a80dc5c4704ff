"""Slow NumPy twins of the recurrent layers' kernels (kernels_cpu/recurrent.py), in float64:
they return the outputs and the new state instead of writing in place."""

from __future__ import annotations

import numpy as np


def short_conv(bcx: np.ndarray, w: np.ndarray, state: np.ndarray, seq_slot: np.ndarray, token_seq: np.ndarray,
               positions: np.ndarray, snap_rows: np.ndarray, snap_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out f32 [N, D], the state pool after the step); arguments as short_conv_kernel's."""
    d = w.shape[0]
    b, c, x = (bcx[:, i * d : (i + 1) * d].astype(np.float64) for i in range(3))
    conv, st = _windows(b * x, w, state, seq_slot, token_seq, positions, snap_rows, snap_slots)
    return (c * conv).astype(np.float32), st.astype(np.float32)


def _windows(src: np.ndarray, w: np.ndarray, state: np.ndarray, seq_slot: np.ndarray, token_seq: np.ndarray,
             positions: np.ndarray, snap_rows: np.ndarray, snap_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each token's causal convolution of src [N, C] (float64) with its sequence's state, and
    the state pool after the step (snapshots copied)."""
    st = state.astype(np.float64).copy()
    out = np.empty(src.shape, np.float64)
    for t in range(src.shape[0]):
        s = seq_slot[token_seq[t]]
        if positions[t] == 0:
            st[s] = 0.0
        window = np.concatenate([st[s], src[t][None].astype(np.float64)], axis=0)  # [L, C]
        out[t] = np.einsum("lc,cl->c", window, w.astype(np.float64))
        st[s] = window[1:]
        for r, slot in zip(snap_rows, snap_slots):
            if r == t:
                st[slot] = st[s]
    return out, st


def conv_silu(src: np.ndarray, off: int, w: np.ndarray, bias: np.ndarray, state: np.ndarray, seq_slot: np.ndarray,
              token_seq: np.ndarray, positions: np.ndarray, snap_rows: np.ndarray,
              snap_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out f32 [N, C], the state pool after the step); arguments as conv_silu_kernel's."""
    c = w.shape[0]
    conv, st = _windows(src[:, off : off + c], w, state, seq_slot, token_seq, positions, snap_rows, snap_slots)
    v = conv + bias
    return (v / (1.0 + np.exp(-v))).astype(np.float32), st.astype(np.float32)


def ssm_scan(xbc: np.ndarray, zxdt: np.ndarray, dt_off: int, dt_bias: np.ndarray, a: np.ndarray, d_skip: np.ndarray,
             state: np.ndarray, seq_slot: np.ndarray, token_seq: np.ndarray, positions: np.ndarray,
             snap_rows: np.ndarray, snap_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y f32 [N, H*P], the state pool after the step); arguments as ssm_scan_kernel's."""
    st = state.astype(np.float64).copy()
    heads, p_dim, ns = state.shape[1:]
    e = heads * p_dim
    groups = (xbc.shape[1] - e) // (2 * ns)
    x64 = xbc.astype(np.float64)
    y = np.empty((xbc.shape[0], e), np.float64)
    for t in range(xbc.shape[0]):
        s = seq_slot[token_seq[t]]
        if positions[t] == 0:
            st[s] = 0.0
        dt = zxdt[t, dt_off : dt_off + heads].astype(np.float64) + dt_bias
        dt = np.where(dt > 20.0, dt, np.log1p(np.exp(dt)))
        x = x64[t, :e].reshape(heads, p_dim)
        b = x64[t, e : e + groups * ns].reshape(groups, ns).repeat(heads // groups, axis=0)  # [H, Ns]
        c = x64[t, e + groups * ns :].reshape(groups, ns).repeat(heads // groups, axis=0)
        st[s] = st[s] * np.exp(dt * a)[:, None, None] + (dt[:, None] * x)[:, :, None] * b[:, None, :]
        y[t] = (np.einsum("hpn,hn->hp", st[s], c) + x * d_skip[:, None]).reshape(e)
        for r, slot in zip(snap_rows, snap_slots):
            if r == t:
                st[slot] = st[s]
    return y.astype(np.float32), st.astype(np.float32)


def gated_group_rmsnorm(y: np.ndarray, z: np.ndarray, w: np.ndarray, groups: int, eps: float) -> np.ndarray:
    """rmsnorm per group of y * silu(z) (z's first E columns), times w; w [0]: no norm."""
    n, e = y.shape
    z64 = z[:, :e].astype(np.float64)
    v = (y.astype(np.float64) * z64 / (1.0 + np.exp(-z64))).reshape(n, groups, e // groups)
    if not w.shape[0]:
        return v.reshape(n, e).astype(np.float32)
    v = v / np.sqrt((v * v).mean(-1, keepdims=True) + eps)
    return (v.reshape(n, e) * w).astype(np.float32)


def delta_rule(qkv: np.ndarray, beta: np.ndarray, alpha: np.ndarray, dt_bias: np.ndarray, a: np.ndarray,
               state: np.ndarray, seq_slot: np.ndarray, token_seq: np.ndarray, positions: np.ndarray,
               snap_rows: np.ndarray, snap_slots: np.ndarray, k_head_of: np.ndarray,
               eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(y f32 [N, H*S], the state pool after the step); arguments as delta_rule_kernel's."""
    st = state.astype(np.float64).copy()
    heads, sd = state.shape[1], state.shape[2]
    key_dim = (qkv.shape[1] - heads * sd) // 2
    k_heads = key_dim // sd
    x = qkv.astype(np.float64)
    y = np.empty((qkv.shape[0], heads * sd), np.float64)
    for t in range(qkv.shape[0]):
        s = seq_slot[token_seq[t]]
        if positions[t] == 0:
            st[s] = 0.0
        q = x[t, :key_dim].reshape(k_heads, sd)
        k = x[t, key_dim : 2 * key_dim].reshape(k_heads, sd)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
        q, k = q[k_head_of], k[k_head_of]  # each value head's key head
        v = x[t, 2 * key_dim :].reshape(heads, sd)
        g = alpha[t].astype(np.float64) + dt_bias
        g = np.where(g > 20.0, g, np.log1p(np.exp(g))) * a
        b = 1.0 / (1.0 + np.exp(-beta[t].astype(np.float64)))
        st[s] *= np.exp(g)[:, None, None]
        d = (v - np.einsum("hji,hi->hj", st[s], k)) * b[:, None]
        st[s] += d[:, :, None] * k[:, None, :]
        y[t] = (np.einsum("hji,hi->hj", st[s], q) / np.sqrt(sd)).reshape(-1)
        for r, slot in zip(snap_rows, snap_slots):
            if r == t:
                st[slot] = st[s]
    return y.astype(np.float32), st.astype(np.float32)


def head_rmsnorm_gate(y: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """rmsnorm per head of len(w) of y, times w, times silu(z)."""
    n, e = y.shape
    v = y.astype(np.float64).reshape(n, e // w.shape[0], w.shape[0])
    v = v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w
    z64 = z.astype(np.float64)
    return (v.reshape(n, e) * z64 / (1.0 + np.exp(-z64))).astype(np.float32)
