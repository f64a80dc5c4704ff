"""Slow NumPy twins of the recurrent layers' kernels (kernels_cpu/recurrent.py), in float64:
they return the outputs and the new state instead of writing in place."""

from __future__ import annotations

import numpy as np


def short_conv(bcx: np.ndarray, w: np.ndarray, state: np.ndarray, seq_slot: np.ndarray, token_seq: np.ndarray,
               positions: np.ndarray, snap_rows: np.ndarray, snap_slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out f32 [N, D], the state pool after the step); arguments as short_conv_kernel's."""
    d, taps = w.shape
    st = state.astype(np.float64).copy()
    b, c, x = (bcx[:, i * d : (i + 1) * d].astype(np.float64) for i in range(3))
    out = np.empty((bcx.shape[0], d), np.float64)
    for t in range(bcx.shape[0]):
        s = seq_slot[token_seq[t]]
        if positions[t] == 0:
            st[s] = 0.0
        window = np.concatenate([st[s], (b[t] * x[t])[None]], axis=0)  # [L, D]
        out[t] = c[t] * np.einsum("ld,dl->d", window, w.astype(np.float64))
        st[s] = window[1:]
        for r, slot in zip(snap_rows, snap_slots):
            if r == t:
                st[slot] = st[s]
    return out.astype(np.float32), st.astype(np.float32)
