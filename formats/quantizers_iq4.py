"""Quantizers of the non-linear 4-bit types IQ4_NL and IQ4_XS: what llama-quantize writes
(ggml's `quantize_iq4_nl` / `quantize_iq4_xs`, the search `quantize_row_iq4_nl_impl` with 7
tries each side), bit for bit, without an importance matrix; with one, the same search under
quantizers_weighted's element weights.

Per 32-value block: codes are the nearest of the 16 table values to x / d; d starts at max / 127
(max: the signed value of largest magnitude) and is refitted by weighted least squares, then
15 more starting scales (-127 + t) / max for t = -7..7 are tried, keeping the best fit. IQ4_NL
stores that d as f16. IQ4_XS stores, per 256, d = -max_scale / 32 as f16 and each block's scale
as a 6-bit l = nearest(scale / d), then re-picks the codes for the scale d * l. Every float
operation is float32 in C's order (sums in element order), as the C code runs it.

Shapes: blocks (n, 32) float32, one row per 32-value block; weights the same. The quantizers
run the compiled search (quant_fit_iq4.py); `block_scales` and `best_index` here are its NumPy
twins.
"""

from __future__ import annotations

import numpy as np

from edge_infer.formats.quant_fit_iq4 import block_scales_kernel, codes_kernel
from edge_infer.formats.quant_round import GROUP_MAX_EPS, first_absmax, nearest_int, seq_sum
from edge_infer.formats.weight_types import IQ4_TABLE

F32 = np.float32
VALUES = np.array(IQ4_TABLE, F32)
TRIES = 7  # llama-quantize's ntry: starting scales (-127 + t) / max for t = -7..7


def best_index(v: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8 over the table: the index of the nearest value (a tie: the upper
    one), 0 / 15 beyond the ends (NaN: 15)."""
    mu = np.clip(np.searchsorted(VALUES, v, side="right"), 1, 15)
    idx = np.where(v - VALUES[mu - 1] < VALUES[mu] - v, mu - 1, mu)
    return np.where(v <= VALUES[0], 0, np.where(v >= VALUES[15], 15, idx))


def _sums(xt: np.ndarray, wt: np.ndarray, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sum w q x, sum w q q) in element order for the codes of scale 1 / inv; xt, wt (32, n)."""
    q = VALUES[best_index(inv[None, :] * xt)]
    return seq_sum(wt * q * xt), seq_sum(wt * q * q)


def block_scales(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x, w (n, 32) -> each block's fitted scale d (n,) float32 (0 for a block below 1e-15)."""
    xt, wt = np.ascontiguousarray(x.T), np.ascontiguousarray(w.T)
    mx = first_absmax(xt, 0)
    sumqx, sumq2 = _sums(xt, wt, F32(1) / (-mx / VALUES[0]))
    d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
    best = d * sumqx
    for t in range(-TRIES, TRIES + 1):
        sumqx, sumq2 = _sums(xt, wt, F32(t - 127) / mx)
        better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(better, sumqx / sumq2, d)
        best = np.where(better, d * sumqx, best)
    return np.where(np.abs(mx) < GROUP_MAX_EPS, F32(0), d).astype(F32)


def fitted_scales(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """block_scales, compiled (quant_fit_iq4): the same bits."""
    d = np.empty(x.shape[0], F32)
    block_scales_kernel(np.ascontiguousarray(x, F32), np.ascontiguousarray(w, F32), TRIES, d)
    return d


def codes_for(x: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """best_index(inv[:, None] * x), compiled: codes uint8 (n, 32)."""
    codes = np.empty(x.shape, np.uint8)
    codes_kernel(np.ascontiguousarray(x, F32), np.ascontiguousarray(inv, F32), codes)
    return codes


def _inverse(d: np.ndarray) -> np.ndarray:
    return np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)


def _pack(codes: np.ndarray) -> np.ndarray:
    """codes (n, 32) -> (n, 16) bytes: low nibble value j, high nibble value j + 16."""
    return (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)  # uint8 codes < 16: no overflow


def quantize_iq4_nl(x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """x (n, 32) float32 blocks [, element weights] -> (n, 18) IQ4_NL blocks: d f16, 16 code bytes."""
    d = fitted_scales(x, x * x if w is None else w)
    codes = codes_for(x, _inverse(d))
    out = np.empty((x.shape[0], 18), np.uint8)
    out[:, :2] = d.astype(np.float16)[:, None].view(np.uint8)
    out[:, 2:] = _pack(codes)
    return out


def quantize_iq4_nl_row_ref(x: np.ndarray) -> np.ndarray:
    """x (n, 32) float32 -> (n, 18) IQ4_NL blocks as ggml's quantize_row_iq4_nl_ref writes them
    (ggml-cpu's from_float: the KV cache's store): no scale search (ntry -1), the codes of
    x * (-127 / max) and their least-squares scale under weights x^2 (an all-zero block: d 0,
    codes 0)."""
    mx = first_absmax(x.T, 0)
    live = np.abs(mx) >= GROUP_MAX_EPS
    inv = F32(1) / np.where(live, mx / F32(-127), F32(1))
    codes = best_index(inv[:, None] * x)
    q = VALUES[codes]
    wq = x * x * q
    sumqx, sumq2 = seq_sum((wq * x).T), seq_sum((wq * q).T)
    d = np.where(live & (sumq2 > 0), sumqx / np.where(sumq2 > 0, sumq2, F32(1)), F32(0)).astype(F32)
    out = np.empty((x.shape[0], 18), np.uint8)
    out[:, :2] = d.astype(np.float16)[:, None].view(np.uint8)
    out[:, 2:] = _pack(np.where(live[:, None], codes, 0).astype(np.uint8))
    return out


def quantize_iq4_xs(x: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """x (n, 256) float32 super-blocks [, element weights] -> (n, 136) IQ4_XS blocks: d f16,
    scales_h u16, scales_l 4 bytes, 128 code bytes."""
    n = x.shape[0]
    xb = x.reshape(n * 8, 32)
    scales = fitted_scales(xb, xb * xb if w is None else w.reshape(n * 8, 32)).reshape(n, 8)
    d = (-first_absmax(scales, 1) / F32(32)).astype(F32)  # the block scale of largest magnitude
    ls = np.clip(nearest_int(_inverse(d)[:, None] * scales), -32, 31)
    dl = (d[:, None] * ls.astype(F32)).astype(F32)
    codes = codes_for(xb, _inverse(dl).reshape(-1))
    u = (ls + 32).astype(np.uint32)
    out = np.empty((n, 136), np.uint8)
    out[:, :2] = d.astype(np.float16)[:, None].view(np.uint8)
    high = ((u >> 4) << (2 * np.arange(8, dtype=np.uint32))).sum(axis=1).astype(np.uint16)
    out[:, 2:4] = high[:, None].view(np.uint8)
    out[:, 4:8] = ((u[:, 0::2] & 15) | ((u[:, 1::2] & 15) << 4)).astype(np.uint8)
    out[:, 8:] = _pack(codes).reshape(n, 128)
    return out
