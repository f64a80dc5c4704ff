"""Element-wise and per-row kernels of a transformer layer: RMSNorm, RoPE, gated activations,
residual adds. Arrays are float32 and C-contiguous; every kernel writes a preallocated output.
Rows are independent, so results never depend on the batch (per-row fixed order).

Rows are split over the threads (a launch costs ~2 us with numba's OpenMP layer) unless there
are too few of them to pay for it."""

from __future__ import annotations

import math

import numba
import numpy as np

from ._jit import kernel
from .fastmath import gelu_tanh, silu


@kernel(inline=True)
def _rms_scale(x, t, eps):
    # float64 sum in index order, as llama.cpp's ggml_compute_forward_rms_norm does
    s = 0.0
    for k in range(x.shape[1]):
        v = np.float64(x[t, k])
        s += v * v
    return np.float32(1.0 / math.sqrt(s / x.shape[1] + eps))


SERIAL_VALUES = 8192  # below this many elements a row loop runs on the calling thread


@kernel(inline=True)
def _rmsnorm_row(x, w, eps, out, t):
    sc = _rms_scale(x, t, eps)
    for k in range(x.shape[1]):
        out[t, k] = np.float32(x[t, k] * sc) * w[k]


@kernel(parallel=True)
def rmsnorm_kernel(x, w, eps, out):
    """out[t] = x[t] / rms(x[t]) * w; x, out: [T, D]; w: [D]."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _rmsnorm_row(x, w, eps, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _rmsnorm_row(x, w, eps, out, t)


@kernel(inline=True)
def _add_rmsnorm_row(h, delta, w, eps, out, t):
    for k in range(h.shape[1]):
        h[t, k] = h[t, k] + delta[t, k]
    _rmsnorm_row(h, w, eps, out, t)


@kernel(parallel=True)
def add_rmsnorm_kernel(h, delta, w, eps, out):
    """h += delta (the residual stream, in place), then out = rmsnorm(h) * w; all [T, D]."""
    if h.size < SERIAL_VALUES:
        for t in range(h.shape[0]):
            _add_rmsnorm_row(h, delta, w, eps, out, t)
    else:
        for t in numba.prange(h.shape[0]):
            _add_rmsnorm_row(h, delta, w, eps, out, t)


@kernel(inline=True)
def _gated_row(gate, up, out, t, gelu):
    if gelu:
        for k in range(gate.shape[1]):
            out[t, k] = gelu_tanh(gate[t, k]) * up[t, k]
    else:
        for k in range(gate.shape[1]):
            out[t, k] = silu(gate[t, k]) * up[t, k]


@kernel(parallel=True)
def silu_mul_kernel(gate, up, out):
    """out = silu(gate) * up (SwiGLU); all [T, F]."""
    if gate.size < SERIAL_VALUES:
        for t in range(gate.shape[0]):
            _gated_row(gate, up, out, t, False)
    else:
        for t in numba.prange(gate.shape[0]):
            _gated_row(gate, up, out, t, False)


@kernel(parallel=True)
def relu_mul_kernel(gate, up, out):
    """out = relu(gate) * up (ReGLU: smallthinker's experts); all [T, F]."""
    if gate.size < SERIAL_VALUES:
        for t in range(gate.shape[0]):
            _relu_gated_row(gate, up, out, t)
    else:
        for t in numba.prange(gate.shape[0]):
            _relu_gated_row(gate, up, out, t)


@kernel(inline=True)
def _relu_gated_row(gate, up, out, t):
    for k in range(gate.shape[1]):
        out[t, k] = max(gate[t, k], np.float32(0.0)) * up[t, k]


@kernel(parallel=True)
def swiglu_oai_kernel(gate, up, out):
    """gpt-oss's clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7): x = min(gate, 7),
    y = clamp(up, -7, 7), out = x * sigmoid(1.702 x) * (y + 1); all [T, F]."""
    if gate.size < SERIAL_VALUES:
        for t in range(gate.shape[0]):
            _swiglu_oai_row(gate, up, out, t)
    else:
        for t in numba.prange(gate.shape[0]):
            _swiglu_oai_row(gate, up, out, t)


OAI_ALPHA, OAI_LIMIT = np.float32(1.702), np.float32(7.0)


@kernel(inline=True)
def _swiglu_oai_row(gate, up, out, t):
    for k in range(gate.shape[1]):
        x = min(gate[t, k], OAI_LIMIT)
        y = min(max(up[t, k], -OAI_LIMIT), OAI_LIMIT)
        glu = x / (np.float32(1.0) + np.float32(math.exp(OAI_ALPHA * -x)))
        out[t, k] = glu * (y + np.float32(1.0))


@kernel(parallel=True)
def relu_sqr_kernel(x, out):
    """out = relu(x)^2 (nemotron_h's ungated FFN activation); both f32 [T, F]."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _relu_sqr_row(x, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _relu_sqr_row(x, out, t)


@kernel(inline=True)
def _relu_sqr_row(x, out, t):
    for k in range(x.shape[1]):
        v = max(x[t, k], np.float32(0.0))
        out[t, k] = v * v


@kernel(parallel=True)
def xielu_kernel(x, alpha_n, alpha_p, beta, eps, out):
    """out = xIELU(x) (apertus's ungated FFN activation, ggml's op_xielu in float32): alpha_p x^2 +
    beta x for x > 0, else (expm1(min(x, eps)) - x) alpha_n + beta x; the alphas as the op
    holds them (alpha_n = beta + softplus(raw), alpha_p = softplus(raw)); x, out f32 [T, F]."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _xielu_row(x, alpha_n, alpha_p, beta, eps, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _xielu_row(x, alpha_n, alpha_p, beta, eps, out, t)


@kernel(inline=True)
def _xielu_row(x, alpha_n, alpha_p, beta, eps, out, t):
    for k in range(x.shape[1]):
        v = x[t, k]
        if v > np.float32(0.0):
            out[t, k] = alpha_p * v * v + beta * v
        else:
            out[t, k] = (np.float32(math.expm1(min(v, eps))) - v) * alpha_n + beta * v


@kernel(parallel=True)
def gelu_mul_kernel(gate, up, out):
    """out = gelu_tanh(gate) * up (GeGLU, the tanh approximation); all [T, F]."""
    if gate.size < SERIAL_VALUES:
        for t in range(gate.shape[0]):
            _gated_row(gate, up, out, t, True)
    else:
        for t in numba.prange(gate.shape[0]):
            _gated_row(gate, up, out, t, True)


@kernel
def scale_kernel(x, factor):
    """x *= factor (in place); x: [T, D]."""
    for t in range(x.shape[0]):
        for k in range(x.shape[1]):
            x[t, k] *= factor


@kernel
def split_gated_q_kernel(qg, head_dim, q, gate):
    """Qwen3.5's gated attention: each head's projection [q (head_dim) | gate (head_dim)] of qg
    f32 [T, 2Q] into q and gate f32 [T, Q]."""
    for t in range(qg.shape[0]):
        for h in range(q.shape[1] // head_dim):
            for i in range(head_dim):
                q[t, h * head_dim + i] = qg[t, 2 * h * head_dim + i]
                gate[t, h * head_dim + i] = qg[t, (2 * h + 1) * head_dim + i]


@kernel
def sigmoid_mul_kernel(x, gate):
    """x *= sigmoid(gate), in place; both f32 [T, Q]."""
    for t in range(x.shape[0]):
        for k in range(x.shape[1]):
            x[t, k] = x[t, k] * (np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-gate[t, k]))))
