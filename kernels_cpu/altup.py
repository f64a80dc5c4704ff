"""gemma3n's AltUp and activation-sparsity kernels (llama.cpp's src/models/gemma3n.cpp): A
residual streams of which one (stream 0) runs the layer, the others predicted from all A by a
per-token mix and corrected by the layer's innovation. Streams are float32 [A, T, D]; every
kernel works row by row (a token's result never depends on the batch) and writes a
preallocated output. Twins: kernels_cpu/reference_altup.py."""

from __future__ import annotations

import math

import numba
import numpy as np

from ._jit import kernel


@kernel(inline=True)
def _mix(coef, r, t, out):
    """out [M] = coef [M, A] @ tanh(r[t]) (the router's modality weights)."""
    for i in range(coef.shape[0]):
        s = np.float32(0.0)
        for k in range(coef.shape[1]):
            s += coef[i, k] * np.float32(math.tanh(r[t, k]))
        out[i] = s


@kernel(parallel=True)
def altup_predict_kernel(streams, r, coef, pred, active):
    """pred[j, t] = sum_k c[A j + k] streams[k, t] + streams[j, t], c = coef [A*A, A] @ tanh(r[t])
    (r f32 [T, A]: the router's output for stream 0); active [T, D] = pred[0] (the stream the
    layer runs on)."""
    a, n, d = streams.shape
    for t in numba.prange(n):
        c = np.empty(a * a, np.float32)
        _mix(coef, r, t, c)
        for j in range(a):
            for e in range(d):
                s = np.float32(0.0)
                for k in range(a):
                    s += c[a * j + k] * streams[k, t, e]
                pred[j, t, e] = s + streams[j, t, e]
        for e in range(d):
            active[t, e] = pred[0, t, e]


@kernel(parallel=True)
def altup_correct_kernel(pred, y, r, coef, streams):
    """streams[j, t] = (y[t] - pred[0, t]) * (c[j] + 1) + pred[j, t], c = coef [A, A] @ tanh(r[t])
    (r f32 [T, A]: the router's output for the layer's output y [T, D])."""
    a, n, d = pred.shape
    for t in numba.prange(n):
        c = np.empty(a, np.float32)
        _mix(coef, r, t, c)
        for j in range(a):
            cj = c[j] + np.float32(1.0)
            for e in range(d):
                streams[j, t, e] = (y[t, e] - pred[0, t, e]) * cj + pred[j, t, e]


@kernel(inline=True)
def _norm2(x, t):
    s = np.float32(0.0)
    for e in range(x.shape[1]):
        s += x[t, e] * x[t, e]
    return np.float32(math.sqrt(s))


@kernel(parallel=True)
def match_norm_kernel(ref, x):
    """x[t] *= |ref[t]| / |x[t]| (L2 norms, no epsilon, as llama.cpp): x takes ref's magnitude."""
    for t in numba.prange(x.shape[0]):
        ratio = _norm2(ref, t) / _norm2(x, t)
        for e in range(x.shape[1]):
            x[t, e] *= ratio


@kernel(parallel=True)
def unembed_mean_kernel(active, unembedded, out):
    """out [T, D] = (active + unembedded[1] + ... + unembedded[A - 1]) / A, summed in that order
    (AltUp's end: stream 0 and the others mapped back to its space; unembedded[0] is unused)."""
    a, n, d = unembedded.shape
    inv = np.float32(1.0 / a)
    for t in numba.prange(n):
        for e in range(d):
            s = active[t, e]
            for j in range(1, a):
                s += unembedded[j, t, e]
            out[t, e] = s * inv


@kernel(parallel=True)
def gaussian_topk_kernel(x, std_mul):
    """x [T, F] = relu(x - (mean + std_mul * std)) per row, std the unbiased (F - 1) standard
    deviation: only the values above the row's std_mul-sigma cutoff stay (gemma3n's sparsity)."""
    n, f = x.shape
    for t in numba.prange(n):
        s = np.float32(0.0)
        for e in range(f):
            s += x[t, e]
        mean = s / np.float32(f)
        v = np.float32(0.0)
        for e in range(f):
            dv = x[t, e] - mean
            v += dv * dv
        cutoff = mean + np.float32(math.sqrt(v / np.float32(f - 1))) * std_mul
        for e in range(f):
            x[t, e] = max(x[t, e] - cutoff, np.float32(0.0))


@kernel(parallel=True)
def mul_rows_kernel(x, w, out):
    """out[t] = x[t] * w (w f32 [D])."""
    for t in numba.prange(x.shape[0]):
        for e in range(x.shape[1]):
            out[t, e] = x[t, e] * w[e]
