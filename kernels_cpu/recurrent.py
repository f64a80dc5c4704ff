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

import numba
import numpy as np

from ._jit import kernel

CHANNELS = 64  # channels per work item


@kernel(parallel=True)
def short_conv_kernel(bcx, w, state, seq_slot, token_seq, positions, snap_rows, snap_slots, out):
    """LFM2's gated short convolution (llama.cpp's shortconv block between in_proj and
    out_proj): bcx f32 [N, 3D] rows [b | c | x]; w f32 [D, L] each channel's taps, oldest
    first; state f32 [slots, L - 1, D] each sequence's last L - 1 values of b * x, oldest
    first; out f32 [N, D] = c * sum_i window_i * w[:, i] over the window [state, b * x] ending
    at the token (summed in tap order from 0.0, as ggml_ssm_conv). Updates the state; after
    token snap_rows[i] (ascending) also copies it into slot snap_slots[i]."""
    n, d = out.shape
    taps = w.shape[1]
    keep = taps - 1
    for item in numba.prange((d + CHANNELS - 1) // CHANNELS):
        lo = item * CHANNELS
        hi = min(d, lo + CHANNELS)
        j = 0
        for t in range(n):
            s = seq_slot[token_seq[t]]
            if positions[t] == 0:
                for i in range(keep):
                    for ch in range(lo, hi):
                        state[s, i, ch] = np.float32(0.0)
            for ch in range(lo, hi):
                bx = bcx[t, ch] * bcx[t, 2 * d + ch]
                acc = np.float32(0.0)
                for i in range(keep):
                    acc += state[s, i, ch] * w[ch, i]
                acc += bx * w[ch, keep]
                for i in range(keep - 1):
                    state[s, i, ch] = state[s, i + 1, ch]
                state[s, keep - 1, ch] = bx
                out[t, ch] = bcx[t, d + ch] * acc
            while j < snap_rows.shape[0] and snap_rows[j] == t:
                for i in range(keep):
                    for ch in range(lo, hi):
                        state[snap_slots[j], i, ch] = state[s, i, ch]
                j += 1
