"""Slow NumPy twins of the CPU kernels (float64 math), for the tests. Same arguments, but they
return their result instead of writing into a preallocated output."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.formats.quants import dequantize_blocks

from .dequant import Q4_1, Q5_0, Q5_1, Q8_0


def decode_rows(w: np.ndarray, qtype: int) -> np.ndarray:
    """uint8 [R, row_bytes] -> float32 [R, K] with the reference dequantizer."""
    from edge_infer.kernels_cpu.dequant import BLOCK_SHAPE

    bs, tb = BLOCK_SHAPE[qtype]
    k = w.shape[1] // tb * bs
    flat = dequantize_blocks(np.ascontiguousarray(w).reshape(-1), GGMLQuantizationType(qtype), w.shape[0] * k)
    return flat.reshape(w.shape[0], k)


def matmul(x: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    return (x.astype(np.float64) @ decode_rows(w, qtype).astype(np.float64).T).astype(np.float32)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    scale = 1.0 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps)
    return (x64 * scale * w).astype(np.float32)


def head_rmsnorm(x: np.ndarray, n_heads: int, head_dim: int, w: np.ndarray, eps: float) -> np.ndarray:
    t = x.reshape(x.shape[0], n_heads, head_dim)
    return rmsnorm(t, w, eps).reshape(x.shape)


def rope(x: np.ndarray, n_heads: int, head_dim: int, n_rot: int, positions: np.ndarray, inv_freq: np.ndarray,
         neox: bool) -> np.ndarray:
    out = x.astype(np.float64).reshape(x.shape[0], n_heads, head_dim).copy()
    theta = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [T, n_rot/2]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    half = n_rot // 2
    if neox:
        a, b = out[..., :half].copy(), out[..., half:n_rot].copy()
        out[..., :half], out[..., half:n_rot] = a * c - b * s, a * s + b * c
    else:
        a, b = out[..., 0:n_rot:2].copy(), out[..., 1:n_rot:2].copy()
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * c - b * s, a * s + b * c
    return out.reshape(x.shape).astype(np.float32)


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)


def gelu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    g = gate.astype(np.float64)
    return (0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3))) * up).astype(np.float32)


def cache_values(cache: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """float64 values of a KV pool stored as f16 bits (uint16), float32, or int8 with scales."""
    if cache.dtype == np.uint16:
        return cache.view(np.float16).astype(np.float64)
    if cache.dtype == np.int8:
        assert scale is not None
        return cache.astype(np.float64) * scale[..., None].astype(np.float64)
    return cache.astype(np.float64)


def paged_attention(q: np.ndarray, k_cache: np.ndarray, k_scale: np.ndarray, v_cache: np.ndarray,
                    v_scale: np.ndarray, block_tables: np.ndarray, token_seq: np.ndarray, positions: np.ndarray,
                    scale: float, window: int) -> np.ndarray:
    """Dense causal attention: gather each sequence's keys 0..p from its block table."""
    n_kv, hd = k_cache.shape[2], k_cache.shape[3]
    bs = k_cache.shape[1]
    n_heads = q.shape[1] // hd
    rep = n_heads // n_kv
    kc, vc = cache_values(k_cache, k_scale), cache_values(v_cache, v_scale)
    out = np.zeros((q.shape[0], n_heads * hd), np.float64)
    for i in range(q.shape[0]):
        p = int(positions[i])
        lo = max(0, p - window + 1) if window > 0 else 0
        js = np.arange(lo, p + 1)
        blocks = block_tables[token_seq[i], js // bs]
        keys, vals = kc[blocks, js % bs], vc[blocks, js % bs]  # [n, n_kv, hd]
        for h in range(n_heads):
            g = h // rep
            s = keys[:, g, :] @ q[i, h * hd : (h + 1) * hd].astype(np.float64) * scale
            e = np.exp(s - s.max())
            out[i, h * hd : (h + 1) * hd] = (e / e.sum()) @ vals[:, g, :]
    return out.astype(np.float32)


def i8_codes(w: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """The integer view of a Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 matrix the int8 kernel computes
    with: u8 codes int64 [R, nb, 32] in column order, scales d float32 [R, nb], mins m float32
    [R, nb] (Q4_1, Q5_1) or None, and the code of zero (weight = d * (code - offset) [+ m])."""
    rows = w.shape[0]

    def half(blk: np.ndarray, at: int) -> np.ndarray:
        return blk[:, :, at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    if qtype == Q8_0:
        blk = w.reshape(rows, -1, 34)
        return blk[:, :, 2:].view(np.int8).astype(np.int64) + 128, half(blk, 0), None, 128
    with_min = qtype in (Q4_1, Q5_1)
    head = 4 if with_min else 2
    fifth = qtype in (Q5_0, Q5_1)
    blk = w.reshape(rows, -1, head + 16 + (4 if fifth else 0))
    qs = blk[:, :, head + (4 if fifth else 0) :].astype(np.int64)
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)
    if fifth:
        qh = blk[:, :, head : head + 4].copy().view(np.uint32)[..., 0].astype(np.int64)
        codes = codes | (((qh[..., None] >> np.arange(32)) & 1) << 4)
    offset = 0 if with_min else (16 if fifth else 8)
    return codes, half(blk, 0), half(blk, 2) if with_min else None, offset


def matmul_i8(xq: np.ndarray, xd: np.ndarray, xsum: np.ndarray, w: np.ndarray, qtype: int) -> np.ndarray:
    """The int8 kernel's exact arithmetic: xq int8 [T, K], xd float32 [T, nb], xsum int32
    [T, nb] (quantized activations) times w -> float32 [T, R]; per block in order, exact integer
    sums, then acc += float32(isum - offset * xsum) * (d * dx) [+ m * (dx * xsum)]."""
    codes, d, m, offset = i8_codes(w, qtype)
    acc = np.zeros((xq.shape[0], w.shape[0]), np.float32)
    for b in range(codes.shape[1]):
        isum = xq[:, b * 32 : (b + 1) * 32].astype(np.int64) @ codes[:, b, :].T - offset * xsum[:, b : b + 1]
        dx = xd[:, b : b + 1]
        term = isum.astype(np.float32) * (d[None, :, b] * dx)
        if m is not None:
            term = term + m[None, :, b] * (dx * xsum[:, b : b + 1].astype(np.float32))
        acc = acc + term
    return acc
