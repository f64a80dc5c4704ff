"""Kernels of the recurrent layers of hybrid models, which keep a fixed-size state per sequence
instead of per-token K/V. The state lives in a pool of slots made by the backend
(`[slots, ...]` per layer); each sequence of a step names its slot (seq_slot [S]) and every
token its sequence (token_seq [N]), as attention's block tables do. A token at position 0
starts from a zero state, so a slot needs no clearing between owners.

Tokens of one sequence are consecutive in the batch in position order and update the state in
that order; threads split channels, never a token's sum, so a token's output is bit-identical
alone, batched, in any chunking and for any thread count (reference_recurrent.py holds the
NumPy twins)."""

from __future__ import annotations

import math

import numba
import numpy as np

from ._jit import REORDER, kernel
from .fastmath import silu

CHANNELS = 64  # channels per work item


@kernel(inline=True)
def _start_channels(state, s, lo, hi, keep):
    for i in range(keep):
        for ch in range(lo, hi):
            state[s, i, ch] = np.float32(0.0)


@kernel(inline=True)
def _snapshot_channels(state, s, lo, hi, keep, snap_rows, snap_slots, j, t):
    """Copy channels lo..hi of slot s's state to the snapshot slots of token t; the next j."""
    while j < snap_rows.shape[0] and snap_rows[j] == t:
        for i in range(keep):
            for ch in range(lo, hi):
                state[snap_slots[j], i, ch] = state[s, i, ch]
        j += 1
    return j


@kernel(parallel=True)
def causal_conv_kernel(src, off, gated, w, bias, state, seq_slot, token_seq, positions, snap_rows, snap_slots, out):
    """A depthwise causal convolution over each sequence's last L tokens: w f32 [C, L] each
    channel's taps, oldest first; state f32 [slots, L - 1, C] each sequence's last L - 1 inputs,
    oldest first; out f32 [N, C]. gated (LFM2's short convolution, src [N, 3C] = [b | c | x]):
    the input is b * x and out = c * conv; else (Mamba2) the input is src[:, off + ch] and out =
    silu(conv + bias). Updates the state; after token snap_rows[i] (ascending) also copies it
    into slot snap_slots[i]."""
    n, c = out.shape
    keep = w.shape[1] - 1
    for item in numba.prange((c + CHANNELS - 1) // CHANNELS):
        lo = item * CHANNELS
        hi = min(c, lo + CHANNELS)
        # per token, each loop runs across the item's channels (contiguous in the state and the
        # rows: vectorised); a channel's sum is its taps in order from 0.0, as ggml_ssm_conv
        x_new, acc = np.empty(hi - lo, np.float32), np.empty(hi - lo, np.float32)
        j = 0
        for t in range(n):
            s = seq_slot[token_seq[t]]
            if positions[t] == 0:
                _start_channels(state, s, lo, hi, keep)
            row = src[t]
            if gated:
                for ch in range(lo, hi):
                    x_new[ch - lo] = row[ch] * row[2 * c + ch]
            else:
                for ch in range(lo, hi):
                    x_new[ch - lo] = row[off + ch]
            for ch in range(lo, hi):
                acc[ch - lo] = np.float32(0.0)
            for i in range(keep):
                past = state[s, i]
                for ch in range(lo, hi):
                    acc[ch - lo] += past[ch] * w[ch, i]
            for ch in range(lo, hi):
                acc[ch - lo] += x_new[ch - lo] * w[ch, keep]
            for i in range(keep - 1):  # the window moves on one token
                dst, nxt = state[s, i], state[s, i + 1]
                for ch in range(lo, hi):
                    dst[ch] = nxt[ch]
            last = state[s, keep - 1]
            for ch in range(lo, hi):
                last[ch] = x_new[ch - lo]
            if gated:
                for ch in range(lo, hi):
                    out[t, ch] = row[c + ch] * acc[ch - lo]
            else:
                for ch in range(lo, hi):
                    out[t, ch] = silu(acc[ch - lo] + bias[ch])
            j = _snapshot_channels(state, s, lo, hi, keep, snap_rows, snap_slots, j, t)


_NO_BIAS = np.empty(0, np.float32)


def short_conv_kernel(bcx: np.ndarray, w: np.ndarray, state: np.ndarray, seq_slot: np.ndarray, token_seq: np.ndarray,
                      positions: np.ndarray, snap_rows: np.ndarray, snap_slots: np.ndarray, out: np.ndarray) -> None:
    """LFM2's gated short convolution (llama.cpp's shortconv block between in_proj and
    out_proj): bcx f32 [N, 3D] rows [b | c | x]; out f32 [N, D] = c * conv(b * x), summed in
    tap order from 0.0 as ggml_ssm_conv (causal_conv_kernel, gated)."""
    causal_conv_kernel(bcx, 0, True, w, _NO_BIAS, state, seq_slot, token_seq, positions, snap_rows, snap_slots, out)


def conv_silu_kernel(src: np.ndarray, off: int, w: np.ndarray, bias: np.ndarray, state: np.ndarray,
                     seq_slot: np.ndarray, token_seq: np.ndarray, positions: np.ndarray, snap_rows: np.ndarray,
                     snap_slots: np.ndarray, out: np.ndarray) -> None:
    """Mamba2's convolution of its x, B, C channels, src's columns off..off+C: out f32 [N, C] =
    silu(conv + bias) (ggml_ssm_conv, add, silu; causal_conv_kernel, not gated)."""
    causal_conv_kernel(src, off, False, w, bias, state, seq_slot, token_seq, positions, snap_rows, snap_slots, out)


@kernel(inline=True)
def _zero_head(state, s, h):
    for r in range(state.shape[2]):
        for c in range(state.shape[3]):
            state[s, h, r, c] = np.float32(0.0)


@kernel(inline=True)
def _snapshot_head(state, s, h, snap_rows, snap_slots, j, t):
    """Copy head h of slot s's state [slots, H, A, B] to the snapshot slots of token t; the next j."""
    while j < snap_rows.shape[0] and snap_rows[j] == t:
        for r in range(state.shape[2]):
            for c in range(state.shape[3]):
                state[snap_slots[j], h, r, c] = state[s, h, r, c]
        j += 1
    return j


@kernel(parallel=True, fastmath=REORDER)
def ssm_scan_kernel(xbc, zxdt, dt_off, dt_bias, a, d_skip, state, seq_slot, token_seq, positions, snap_rows,
                    snap_slots, y):
    """Mamba2's selective scan (ggml_ssm_scan with a scalar decay per head, then + D x): xbc
    f32 [N, H*P + 2*G*Ns] the convolved [x | B | C] (head h reads group h // (H / G));
    zxdt f32 [N, *] the in_proj output, dt at columns dt_off..dt_off+H; dt_bias, a (= -exp(A_log)),
    d_skip f32 [H]; state f32 [slots, H, P, Ns]; y f32 [N, H*P]. Per token, head h:
    dt = softplus(dt + dt_bias), state = state * exp(dt * a) + dt * x B, y = state . C + D x.
    Threads split heads; each (token, head, p)'s sum over Ns has one fixed order."""
    n = y.shape[0]
    heads, p_dim, ns = state.shape[1], state.shape[2], state.shape[3]
    d_inner = heads * p_dim
    groups = (xbc.shape[1] - d_inner) // (2 * ns)
    per_group = heads // groups
    for h in numba.prange(heads):
        g = h // per_group
        b_at = d_inner + g * ns
        c_at = d_inner + groups * ns + g * ns
        j = 0
        for t in range(n):
            s = seq_slot[token_seq[t]]
            if positions[t] == 0:
                _zero_head(state, s, h)
            dt = zxdt[t, dt_off + h] + dt_bias[h]
            if dt <= np.float32(20.0):
                dt = np.float32(math.log(np.float32(1.0) + np.float32(math.exp(dt))))
            da = np.float32(math.exp(dt * a[h]))
            for p in range(p_dim):
                xv = xbc[t, h * p_dim + p]
                x_dt = xv * dt
                acc = np.float32(0.0)
                for k in range(ns):
                    st = state[s, h, p, k] * da + xbc[t, b_at + k] * x_dt
                    state[s, h, p, k] = st
                    acc += st * xbc[t, c_at + k]
                y[t, h * p_dim + p] = acc + xv * d_skip[h]
            j = _snapshot_head(state, s, h, snap_rows, snap_slots, j, t)


@kernel(parallel=True)
def gated_group_rmsnorm_kernel(y, z, w, groups, eps, out):
    """Mamba2's output: out = rmsnorm(y * silu(z)) * w, the norm over each of `groups` equal
    slices of a row (sum of squares in float64, index order, as ggml's rms_norm); y, out f32
    [N, E]; z f32 [N, *] (its first E columns); w f32 [E], or [0]: no norm (falcon-h1 without
    ssm_norm), out = y * silu(z)."""
    n, e = y.shape
    width = e // groups
    normed = w.shape[0] > 0
    for t in numba.prange(n):
        for g in range(groups):
            lo = g * width
            ss = 0.0
            for k in range(lo, lo + width):
                v = y[t, k] * silu(z[t, k])
                out[t, k] = v
                ss += np.float64(v) * np.float64(v)
            if not normed:
                continue
            sc = np.float32(1.0 / math.sqrt(ss / width + eps))
            for k in range(lo, lo + width):
                out[t, k] = np.float32(out[t, k] * sc) * w[k]


@kernel(inline=True)
def _l2_scale(x, t, lo, n, eps):
    """1 / sqrt(sum of x[t, lo:lo+n]^2 + eps), as llama.cpp's build_gdn_l2_norm computes it:
    rms_norm with eps / n (sum in float64), then a scale by 1 / sqrt(n)."""
    s = 0.0
    for i in range(lo, lo + n):
        v = np.float64(x[t, i])
        s += v * v
    return np.float32(1.0 / math.sqrt(s / n + eps / n)) * np.float32(1.0 / math.sqrt(n))


@kernel(parallel=True, fastmath=REORDER)
def delta_rule_kernel(qkv, beta, alpha, dt_bias, a, state, seq_slot, token_seq, positions, snap_rows, snap_slots,
                      k_head_of, eps, y):
    """Qwen3.5's gated delta rule (llama.cpp's gated_delta_net op, one token at a time): qkv f32
    [N, 2*Hk*S + H*S] the convolved [q | k | v]; value head h reads key head k_head_of[h] (i32
    [H]: h % Hk in Qwen3.5, ggml's repeat; h // (H / Hk) in Qwen3-Next, grouped); beta, alpha f32
    [N, H] their projections; dt_bias, a (-exp(A_log)) f32 [H]; state
    f32 [slots, H, S, S] (row j: value dim, column i: key dim); y f32 [N, H*S]. Per token and
    value head: q, k l2-normalised; g = exp(softplus(alpha + dt_bias) * a); b = sigmoid(beta);
    state *= g; d = (v - state k) * b; state += d k^T; y = state q / sqrt(S). Threads split
    heads; every sum has one fixed order."""
    n = y.shape[0]
    heads, sd = state.shape[1], state.shape[2]
    key_dim = (qkv.shape[1] - heads * sd) // 2
    scale = np.float32(1.0 / math.sqrt(sd))
    for h in numba.prange(heads):
        kh = k_head_of[h]
        q_at, k_at, v_at = kh * sd, key_dim + kh * sd, 2 * key_dim + h * sd
        qn, kn = np.empty(sd, np.float32), np.empty(sd, np.float32)  # the token's normed q and k
        j0 = 0
        for t in range(n):
            s = seq_slot[token_seq[t]]
            if positions[t] == 0:
                _zero_head(state, s, h)
            sq = _l2_scale(qkv, t, q_at, sd, eps)
            sk = _l2_scale(qkv, t, k_at, sd, eps)
            row_in = qkv[t]
            for c in range(sd):
                qn[c] = row_in[q_at + c] * sq
                kn[c] = row_in[k_at + c] * sk
            g_in = alpha[t, h] + dt_bias[h]
            if g_in <= np.float32(20.0):
                g_in = np.float32(math.log(np.float32(1.0) + np.float32(math.exp(g_in))))
            decay = np.float32(math.exp(g_in * a[h]))
            b = np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-beta[t, h])))
            head = state[s, h]
            for r in range(sd):
                # one contiguous row of the state (1-D: LLVM vectorises both sweeps)
                row = head[r]
                acc = np.float32(0.0)
                for c in range(sd):
                    st = row[c] * decay
                    row[c] = st
                    acc += st * kn[c]
                d = (row_in[v_at + r] - acc) * b
                out = np.float32(0.0)
                for c in range(sd):
                    st = row[c] + kn[c] * d
                    row[c] = st
                    out += st * qn[c]
                y[t, h * sd + r] = out * scale
            j0 = _snapshot_head(state, s, h, snap_rows, snap_slots, j0, t)


@kernel(parallel=True)
def head_rmsnorm_gate_kernel(y, z, w, eps, out):
    """Qwen3.5's gated norm: out = rmsnorm(y per head of len(w)) * w * silu(z) (sum of squares in
    float64, index order); y, z, out f32 [N, H*S]; w f32 [S]."""
    n, e = y.shape
    sd = w.shape[0]
    for t in numba.prange(n):
        for lo in range(0, e, sd):
            ss = 0.0
            for k in range(lo, lo + sd):
                v = np.float64(y[t, k])
                ss += v * v
            sc = np.float32(1.0 / math.sqrt(ss / sd + eps))
            for k in range(sd):
                out[t, lo + k] = np.float32(y[t, lo + k] * sc) * w[k] * silu(z[t, lo + k])
