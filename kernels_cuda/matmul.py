"""CUDA matmuls and embedding rows (numba.cuda). One block of THREADS threads per output row,
looping over the step's tokens: a token's row is computed by the same threads in the same order
whatever the batch, so GEMV rows equal GEMM rows bit for bit.

  quantize_q8_kernel(x f32 [T, K], xq4 i32 [T, K/4], xd f32 [T, K/32], xs16 i32 [T, K/16])
      per 32 columns: d = max|x| / 127 (float32), codes rint(x / d) packed 4 per int32 (byte 0
      first), sums of each 16 codes; as kernels_cpu's quantize_rows_q8.   grid (T,)
  matmul_codes_kernel(xq4, xd, xs16, q4 i32 [R, K/4] | [R, K/8], nibbles, off, s f32 [R, K/16],
                      o f32 [R, K/16], out f32 [T, R])
      out[t, r] = sum over 16-column groups g of s[r, g] * (d_x * isum) + o[r, g] * (d_x * xsum16),
      isum the codes' integer dot product by dp4a; thread j takes g = j, j + THREADS, ..., then
      the THREADS partial sums are added in thread order.   grid (R,)
      nibbles: q4 holds layout.py's 4-bit form (8 codes + off per word, half the bytes): a
      word's masked low and high nibbles are two dp4a words, and isum - off * xsum16 is the
      int8 form's integer sum, so the result is the int8 form's bit for bit (off 0 otherwise).
  matmul_float_kernel(x f32 [T, K], f f16|f32 [R, K], out f32 [T, R])   float32 products.  grid (R,)
  embed_codes_kernel(ids i32 [N], q i8 [V, K], s, o, scale f32, out f32 [N, K])
  embed_nibbles_kernel(ids, qn u8 [V, K/2], off, s, o, scale, out)
  embed_float_kernel(ids, f, scale, out)            out[i] = decoded row ids[i] * scale.  grid (N,)
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from .intrinsics import LANES, dp4a

THREADS = LANES  # one warp per block
LOW_NIBBLES = 0x0F0F0F0F
TOKENS = LANES  # tokens whose partial sums are reduced together (one per thread): two barriers per 32 tokens


@cuda.jit
def quantize_q8_kernel(x, xq4, xd, xs16):
    t = cuda.blockIdx.x
    for b in range(cuda.threadIdx.x, x.shape[1] // 32, cuda.blockDim.x):
        amax = float32(0.0)
        for j in range(32):
            a = abs(x[t, b * 32 + j])
            if a > amax:
                amax = a
        d = amax / float32(127.0)
        inv = float32(1.0) / d if d != float32(0.0) else float32(0.0)
        xd[t, b] = d
        for half in range(2):
            total = int32(0)
            for w in range(4):
                word = 0
                for i in range(4):
                    c = int32(round(x[t, b * 32 + half * 16 + w * 4 + i] * inv))
                    total += c
                    word |= (int(c) & 0xFF) << (8 * i)
                if word >= 2**31:
                    word -= 2**32
                xq4[t, b * 8 + half * 4 + w] = int32(word)
            xs16[t, b * 2 + half] = total


@cuda.jit
def matmul_codes_kernel(xq4, xd, xs16, q4, nibbles, off, s, o, out):
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    sh = cuda.shared.array((TOKENS, THREADS), np.float32)
    for t0 in range(0, xq4.shape[0], TOKENS):
        nt = min(TOKENS, xq4.shape[0] - t0)
        for u in range(nt):
            t = t0 + u
            acc = float32(0.0)
            for g in range(tid, s.shape[1], THREADS):
                isum = int32(0)
                if nibbles:  # two words of 8 nibbles: each word's low and high halves
                    for h in range(2):
                        word = q4[r, g * 2 + h]
                        isum = dp4a(word & LOW_NIBBLES, xq4[t, g * 4 + 2 * h], isum)
                        isum = dp4a((word >> 4) & LOW_NIBBLES, xq4[t, g * 4 + 2 * h + 1], isum)
                else:
                    for w in range(4):
                        isum = dp4a(q4[r, g * 4 + w], xq4[t, g * 4 + w], isum)
                xs = xs16[t, g]
                dx = xd[t, g // 2]
                acc += s[r, g] * (dx * float32(isum - off * xs)) + o[r, g] * (dx * float32(xs))
            sh[u, tid] = acc
        _finish_rows(sh, nt, t0, r, out)


@cuda.jit
def matmul_float_kernel(x, f, out):
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    sh = cuda.shared.array((TOKENS, THREADS), np.float32)
    for t0 in range(0, x.shape[0], TOKENS):
        nt = min(TOKENS, x.shape[0] - t0)
        for u in range(nt):
            acc = float32(0.0)
            for k in range(tid, x.shape[1], THREADS):
                acc += float32(f[r, k]) * x[t0 + u, k]
            sh[u, tid] = acc
        _finish_rows(sh, nt, t0, r, out)


@cuda.jit(device=True)
def _finish_rows(sh, nt, t0, r, out):
    """Thread u adds token t0 + u's THREADS partial sums in thread order into out[t0 + u, r]."""
    cuda.syncthreads()
    u = cuda.threadIdx.x
    if u < nt:
        total = sh[u, 0]
        for j in range(1, THREADS):
            total += sh[u, j]
        out[t0 + u, r] = total
    cuda.syncthreads()


@cuda.jit
def embed_codes_kernel(ids, q, s, o, scale, out):
    i = cuda.blockIdx.x
    row = ids[i]
    for k in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        g = k // 16
        out[i, k] = (s[row, g] * float32(q[row, k]) + o[row, g]) * scale


@cuda.jit
def embed_nibbles_kernel(ids, qn, off, s, o, scale, out):
    i = cuda.blockIdx.x
    row = ids[i]
    for k in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        b = qn[row, (k // 8) * 4 + k % 4]
        u = (int32(b) >> 4) if k % 8 >= 4 else (int32(b) & 15)
        out[i, k] = (s[row, k // 16] * float32(u - off) + o[row, k // 16]) * scale


@cuda.jit
def embed_float_kernel(ids, f, scale, out):
    i = cuda.blockIdx.x
    row = ids[i]
    for k in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[i, k] = float32(f[row, k]) * scale
