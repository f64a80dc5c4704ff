"""CUDA per-row and elementwise kernels (float32; rows independent). Row kernels run one block
of ROW_THREADS threads per row (grid (T,)); elementwise ones take a 2-D grid over (row, column
chunk) with ELEM_THREADS threads.

  rmsnorm_kernel(x [T, D], w [D], eps, out)        out = (x * rsqrt(mean(x^2) + eps)) * w
  add_rmsnorm_kernel(h, delta, w, eps, out)        h += delta in place, then out = rmsnorm(h)
  silu_mul_kernel(gate, up, out), gelu_mul_kernel(gate, up, out)   (tanh GELU)
  scale_kernel(x, factor), add_kernel(h, delta), softcap_kernel(x, cap)   in place
  take_rows_kernel(x [T, C], rows i64 [M], out [M, C]), take_ids_kernel(x i32 [T], rows, out i32 [M])
  argmax_kernel(x [M, V], out i32 [M])             the lowest index of each row's maximum
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32

from .intrinsics import LANES, block_sum

ROW_THREADS = LANES
ELEM_THREADS = 64
GELU_C = float32(math.sqrt(2.0 / math.pi))
GELU_A = float32(0.044715)


@cuda.jit(device=True)
def _norm_row(x, w, eps, out, t, sh):
    tid = cuda.threadIdx.x
    ss = float32(0.0)
    for k in range(tid, x.shape[1], ROW_THREADS):
        ss += x[t, k] * x[t, k]
    total = block_sum(sh, tid, ss)
    sc = float32(1.0) / math.sqrt(total / float32(x.shape[1]) + eps)
    for k in range(tid, x.shape[1], ROW_THREADS):
        out[t, k] = (x[t, k] * sc) * w[k]


@cuda.jit
def rmsnorm_kernel(x, w, eps, out):
    sh = cuda.shared.array(ROW_THREADS, np.float32)
    _norm_row(x, w, eps, out, cuda.blockIdx.x, sh)


@cuda.jit
def add_rmsnorm_kernel(h, delta, w, eps, out):
    t = cuda.blockIdx.x
    for k in range(cuda.threadIdx.x, h.shape[1], ROW_THREADS):
        h[t, k] = h[t, k] + delta[t, k]  # each thread normalizes the columns it added
    sh = cuda.shared.array(ROW_THREADS, np.float32)
    _norm_row(h, w, eps, out, t, sh)


@cuda.jit
def silu_mul_kernel(gate, up, out):
    t, k = cuda.blockIdx.x, cuda.blockIdx.y * ELEM_THREADS + cuda.threadIdx.x
    if k < gate.shape[1]:
        g = gate[t, k]
        out[t, k] = g / (float32(1.0) + math.exp(-g)) * up[t, k]


@cuda.jit
def gelu_mul_kernel(gate, up, out):
    t, k = cuda.blockIdx.x, cuda.blockIdx.y * ELEM_THREADS + cuda.threadIdx.x
    if k < gate.shape[1]:
        g = gate[t, k]
        inner = GELU_C * (g + GELU_A * g * g * g)
        out[t, k] = float32(0.5) * g * (float32(1.0) + math.tanh(inner)) * up[t, k]


@cuda.jit
def scale_kernel(x, factor):
    t, k = cuda.blockIdx.x, cuda.blockIdx.y * ELEM_THREADS + cuda.threadIdx.x
    if k < x.shape[1]:
        x[t, k] = x[t, k] * factor


@cuda.jit
def add_kernel(h, delta):
    t, k = cuda.blockIdx.x, cuda.blockIdx.y * ELEM_THREADS + cuda.threadIdx.x
    if k < h.shape[1]:
        h[t, k] = h[t, k] + delta[t, k]


@cuda.jit
def softcap_kernel(x, cap):
    t, k = cuda.blockIdx.x, cuda.blockIdx.y * ELEM_THREADS + cuda.threadIdx.x
    if k < x.shape[1]:
        x[t, k] = math.tanh(x[t, k] / cap) * cap


@cuda.jit
def take_rows_kernel(x, rows, out):
    i = cuda.blockIdx.x
    for k in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        out[i, k] = x[rows[i], k]


@cuda.jit
def take_ids_kernel(x, rows, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[rows[i]]


@cuda.jit
def argmax_kernel(x, out):
    t, tid = cuda.blockIdx.x, cuda.threadIdx.x
    best = cuda.shared.array(ROW_THREADS, np.float32)
    where = cuda.shared.array(ROW_THREADS, np.int32)
    b, bi = -math.inf, int32(0)
    for k in range(tid, x.shape[1], ROW_THREADS):  # ascending k: a later equal value never wins
        if x[t, k] > b:
            b, bi = x[t, k], int32(k)
    best[tid], where[tid] = b, bi
    cuda.syncthreads()
    step = ROW_THREADS // 2
    while step > 0:
        if tid < step:
            ob, oi = best[tid + step], where[tid + step]
            if ob > best[tid] or (ob == best[tid] and oi < where[tid]):
                best[tid], where[tid] = ob, oi
        cuda.syncthreads()
        step //= 2
    if tid == 0:
        out[t] = where[0]
