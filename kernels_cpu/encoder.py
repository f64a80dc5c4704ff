"""Kernels of a bidirectional encoder (BERT and its kin): LayerNorm with a bias after a residual
add, a bias-then-GELU activation, and attention over each input's own tokens in both directions
(no KV cache: K and V are the step's rows). float32, C-contiguous, preallocated outputs; rows
are independent and each query reads only its own input's rows in a fixed order, so a result
never depends on what else is in the batch. Twins: reference_encoder.py."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np

from . import _jit
from ._jit import REORDER, kernel
from .dequant import decode_rows
from .fastmath import fast_exp, gelu_tanh
from .ops import SERIAL_VALUES


@kernel(inline=True)
def _layernorm_row(x, w, b, eps, out, t):
    """out[t] = (x[t] - mean) / sqrt(var + eps) * w + b, as ggml_norm then mul and add: the mean
    and the variance of the centred values summed in float64, the scale in float32."""
    n = x.shape[1]
    s = 0.0
    for k in range(n):
        s += np.float64(x[t, k])
    mean = np.float32(s / n)
    v = 0.0
    for k in range(n):
        c = np.float64(x[t, k] - mean)
        v += c * c
    sc = np.float32(1.0 / math.sqrt(np.float32(v / n) + eps))
    for k in range(n):
        out[t, k] = np.float32((x[t, k] - mean) * sc) * w[k] + b[k]


@kernel(parallel=True)
def layernorm_kernel(x, w, b, eps, out):
    """out = LayerNorm(x) * w + b; x, out: [T, D] (distinct); w, b: [D]."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _layernorm_row(x, w, b, eps, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _layernorm_row(x, w, b, eps, out, t)


@kernel(inline=True)
def _add_layernorm_row(x, bias, res, w, b, eps, out, t):
    has_bias = bias.shape[0] > 0
    for k in range(x.shape[1]):
        v = x[t, k] + bias[k] if has_bias else x[t, k]
        x[t, k] = v + res[t, k]
    _layernorm_row(x, w, b, eps, out, t)


@kernel(parallel=True)
def add_layernorm_kernel(x, bias, res, w, b, eps, out):
    """x = x + bias + res (in place: a projection, its bias [D] ([0]: none) and the residual),
    then out = LayerNorm(x) * w + b; x, res, out: [T, D], three distinct arrays."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _add_layernorm_row(x, bias, res, w, b, eps, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _add_layernorm_row(x, bias, res, w, b, eps, out, t)


@kernel(inline=True)
def _input_row(x, type_row, pos_table, positions, w, b, eps, out, t):
    has_pos = pos_table.shape[0] > 0
    for k in range(x.shape[1]):
        v = x[t, k] + type_row[k]
        x[t, k] = v + pos_table[positions[t], k] if has_pos else v
    _layernorm_row(x, w, b, eps, out, t)


@kernel(parallel=True)
def input_layernorm_kernel(x, type_row, pos_table, positions, w, b, eps, out):
    """The encoder's input: x [T, D] token embeddings + type_row [D] (token type 0) + the
    learned position embedding pos_table[positions[t]] ([0, D]: none), LayerNorm'd into out."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _input_row(x, type_row, pos_table, positions, w, b, eps, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _input_row(x, type_row, pos_table, positions, w, b, eps, out, t)


@kernel(inline=True)
def _bias_gelu_row(x, bias, out, t):
    has_bias = bias.shape[0] > 0
    for k in range(x.shape[1]):
        v = x[t, k] + bias[k] if has_bias else x[t, k]
        out[t, k] = gelu_tanh(v)


@kernel(parallel=True)
def bias_gelu_kernel(x, bias, out):
    """out = gelu_tanh(x + bias); x, out [T, F], bias [F] ([0]: none)."""
    if x.size < SERIAL_VALUES:
        for t in range(x.shape[0]):
            _bias_gelu_row(x, bias, out, t)
    else:
        for t in numba.prange(x.shape[0]):
            _bias_gelu_row(x, bias, out, t)


@contextmanager
def kernel_threads(n: int) -> Iterator[None]:
    """The calling thread's parallel kernels run on n threads for the block (numba's thread
    count is the calling thread's own), then on as many as before."""
    prev = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        numba.set_num_threads(prev)


@kernel
def widen_rows_kernel(qtype, w, r0, r1, out):
    """Rows r0 .. r1 - 1 of w (uint8 [rows, row bytes] of a float type: F16, BF16, F32) as
    float32 into out [r1 - r0, cols], on the calling thread (vcvtph2ps where F16C is: ~17x
    NumPy's float16 cast). For the vision towers' float matrices before a BLAS product."""
    for r in range(r0, r1):
        decode_rows(qtype, w, r, out, r - r0)


@kernel(fastmath=REORDER)
def softmax_rows_kernel(x, inv):
    """x [T, N] float32 in place: exp(x[t, j] - max_j x[t, j]) (fastmath.fast_exp); inv [T]
    float32: 1 / each row's sum of them (the caller scales after its product with V). On the
    calling thread (the vision towers run one head per pool thread: models/vision_blas.py),
    the row's reductions vectorized (REORDER): a row's bits do not depend on the other rows.
    For the vision towers' [patches, patches] scores."""
    n = x.shape[1]
    for t in range(x.shape[0]):
        # the max in 16 lanes: a single running max (max() or a select) stayed scalar, 6x slower
        # than the exp pass; any order gives the same maximum
        lanes = np.full(16, x[t, 0], np.float32)
        for j0 in range(0, n - 15, 16):
            for k in range(16):
                v = x[t, j0 + k]
                lanes[k] = v if v > lanes[k] else lanes[k]
        best = lanes[0]
        for k in range(16):
            best = lanes[k] if lanes[k] > best else best
        for j in range(n - n % 16, n):
            best = x[t, j] if x[t, j] > best else best
        total = np.float32(0.0)
        for j in range(x.shape[1]):
            e = fast_exp(x[t, j] - best)
            x[t, j] = e
            total += e
        inv[t] = np.float32(1.0) / total


@kernel(inline=True)
def _attend(q, k, v, t, h, s0, s1, head_dim, rep, scale, slopes, sc, acc, out):
    """Query t, head h over rows s0 .. s1 - 1; sc [>= s1 - s0] and acc [head_dim] scratch."""
    qo, ko, n = h * head_dim, (h // rep) * head_dim, s1 - s0
    best = np.float32(-np.inf)
    for j in range(n):
        dot = np.float32(0.0)
        for d in range(head_dim):
            dot += q[t, qo + d] * k[s0 + j, ko + d]
        s = dot * scale
        if slopes.shape[0] > 0:
            s += slopes[h] * np.float32(-abs(t - s0 - j))
        sc[j] = s
        best = max(best, s)
    total = 0.0
    for j in range(n):
        e = fast_exp(sc[j] - best)
        sc[j] = e
        total += e
    inv = np.float32(1.0 / total)
    for d in range(head_dim):
        acc[d] = 0.0
    for j in range(n):
        p = sc[j] * inv
        for d in range(head_dim):
            acc[d] = _jit.fmadd(p, v[s0 + j, ko + d], acc[d])
    for d in range(head_dim):
        out[t, qo + d] = acc[d]


@kernel(inline=True)
def _attend_run(q, k, v, seq_start, seq_end, head_dim, rep, scale, slopes, window, j0, j1, sc, acc, out):
    """Jobs j0 .. j1 - 1 ((token, head) pairs, token-major)."""
    n_heads = q.shape[1] // head_dim
    for job in range(j0, j1):
        t, h = job // n_heads, job % n_heads
        s0, s1 = seq_start[t], seq_end[t]
        if window > 0:
            s0, s1 = max(s0, t - window // 2), min(s1, t + window // 2 + 1)
        _attend(q, k, v, t, h, s0, s1, head_dim, rep, scale, slopes, sc, acc, out)


@kernel(parallel=True)
def encoder_attention_kernel(q, k, v, seq_start, seq_end, head_dim, scale, slopes, window, n_threads, out):
    """Bidirectional attention: query t (row of q [T, H * hd]) attends over rows
    seq_start[t] .. seq_end[t] - 1 of k, v [T, G * hd] (its own input), those within
    window // 2 rows of t when window > 0 (llama.cpp's symmetric sliding window), head h over
    K/V head h // (H / G). Scores are q.k * scale, plus slopes[h] * -|i - j| when slopes [H] has
    elements (ALiBi); softmax in float32 (fastmath.fast_exp, as paged attention) with a float64
    normaliser; out [T, H * hd]. The (token, head) jobs are split in equal runs over n_threads
    threads, each with its own scratch; a short step runs on the calling thread."""
    n_tok = q.shape[0]
    n_heads = q.shape[1] // head_dim
    rep = n_heads // (k.shape[1] // head_dim)
    longest = 0
    for t in range(n_tok):
        longest = max(longest, seq_end[t] - seq_start[t])
    jobs = n_tok * n_heads
    # a parallel launch costs more than a short step's attention
    n_par = 1 if jobs * longest * head_dim < 32768 else min(n_threads, jobs)
    sc = np.empty((n_par, longest), np.float32)
    acc = np.empty((n_par, head_dim), np.float32)
    if n_par == 1:
        _attend_run(q, k, v, seq_start, seq_end, head_dim, rep, scale, slopes, window, 0, jobs, sc[0], acc[0], out)
    else:
        for c in numba.prange(n_par):
            _attend_run(q, k, v, seq_start, seq_end, head_dim, rep, scale, slopes, window, c * jobs // n_par,
                        (c + 1) * jobs // n_par, sc[c], acc[c], out)
