"""The attention tiles' reads of the KV pool (kernels_cpu.attention's layouts) as float32,
one form per pool kind, chosen at compile time by the type of the scale place: an empty float32
array for f16 / f32 pools (K transposed: a dimension's 16 keys are one run), an int64 [1] GGML
type id for llama.cpp's block types (kernels_cpu.kv_quant; a chunk's rows decoded by
decode_kv_rows, keys then transposed in registers by simd_attn.transpose16).

    key_chunk(k_cache, k_aux, blk, g, c0, cw, scale, kt, ks, kv)
        kt[16 d + l] = key c0 + l of block blk, kv-head g, dimension d, as float32 (l < cw);
        ks[l] = scale; kv [16, hd]: scratch (a block type's rows decode there first).
    value_rows(v_cache, v_aux, blk, off, m, g, kv)
        kv[u] = value row off + u of block blk, kv-head g, as float32 (u < m).
    pool_flat(cache, aux)
        a plain pool flat (the lanes read its blocks in place), a block type's empty.
(head_dim_of, the head size of a V pool, is kv_quant's.)
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload

from edge_infer.formats.weight_types import IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0

from ._jit import HAS_F16C, kernel
from .attention import value_at1
from .dequant import decode_q4_0, decode_q4_1, decode_q5_0, decode_q5_1, decode_q8_0
from .dequant_iq import decode_iq4_nl
from .simd_attn import transpose16, widen16

LANES = 16  # keys per score vector


@kernel(inline=True)
def _widen(dst, do, src, so, n):
    """dst[do:do + n] = src[so:so + n] as float32; 1-D arrays."""
    whole = n // LANES * LANES if HAS_F16C else 0  # elsewhere half -> float is a call numba's JIT cannot link
    widen16(dst, do, src, so, whole // LANES)
    a, b = src[so + whole : so + n], dst[do + whole : do + n]  # views, a loop from 0: no gathers
    for j in range(n - whole):
        b[j] = value_at1(a, j)


@kernel
def decode_kv_rows(qtype, rows, r0, stride, n, out):
    """out[u] = rows[r0 + u * stride] as float32 for u < n: a chunk's (token, head) rows of a KV
    block type (kv_quant.KV_BLOCK_TYPES) in one call, each row's decoder (kernels_cpu.dequant's,
    the same bits) inlined in the loop over them."""
    for u in range(n):
        r = r0 + u * stride
        if qtype == Q8_0:
            decode_q8_0(rows, r, out, u)
        elif qtype == Q4_0:
            decode_q4_0(rows, r, out, u)
        elif qtype == Q4_1:
            decode_q4_1(rows, r, out, u)
        elif qtype == Q5_0:
            decode_q5_0(rows, r, out, u)
        elif qtype == Q5_1:
            decode_q5_1(rows, r, out, u)
        elif qtype == IQ4_NL:
            decode_iq4_nl(rows, r, out, u)
        else:
            raise ValueError("decode_kv_rows: not a KV block type")


def key_chunk(k_cache, k_aux, blk, g, c0, cw, scale, kt, ks, kv):
    """See the module docstring (overloaded by pool kind)."""
    raise NotImplementedError


@overload(key_chunk, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_key_chunk(k_cache, k_aux, blk, g, c0, cw, scale, kt, ks, kv):
    if isinstance(k_aux.dtype, types.Integer):
        def blocks(k_cache, k_aux, blk, g, c0, cw, scale, kt, ks, kv):
            nb, bs, n_kv, rb = k_cache.shape
            rows = k_cache.reshape(nb * bs * n_kv, rb)
            hd = kv.shape[1]
            decode_kv_rows(k_aux[0], rows, (blk * bs + c0) * n_kv + g, n_kv, cw, kv)
            if cw == LANES and hd % LANES == 0:  # transposed: dimension d's keys side by side
                transpose16(kt, kv.reshape(-1), hd, hd // LANES)
            else:
                for u in range(cw):
                    src = kv[u]
                    for d in range(hd):
                        kt[LANES * d + u] = src[d]
            for u in range(cw):
                ks[u] = scale
        return blocks

    def plain(k_cache, k_aux, blk, g, c0, cw, scale, kt, ks, kv):
        hd, bs = k_cache.shape[2], k_cache.shape[3]
        kflat = k_cache.reshape(-1)
        base = (blk * k_cache.shape[1] + g) * hd * bs + c0
        if bs == LANES:  # the head's block is kt's layout already: one run of hd * 16 values
            _widen(kt, 0, kflat, base, hd * LANES)
        else:
            for d in range(hd):
                _widen(kt, LANES * d, kflat, base + d * bs, cw)
        for u in range(cw):
            ks[u] = scale
    return plain


def pool_flat(cache, aux):
    """A plain (f16 / f32) pool's array as one flat run, which the attention lanes read in place
    (simd_attn widens half bits in the register); a block type's pool (and an f16 one on x86
    without F16C): an empty float32 array."""
    raise NotImplementedError


@overload(pool_flat, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_pool_flat(cache, aux):
    # halves widened in a register need F16C on x86 (elsewhere the widening is a call numba's
    # JIT cannot link): such a target converts them as before, through key_chunk / value_rows
    if isinstance(aux.dtype, types.Integer) or (cache.dtype == types.uint16 and not HAS_F16C):
        def blocks(cache, aux):
            return np.empty(0, np.float32)
        return blocks

    def plain(cache, aux):
        return cache.reshape(-1)
    return plain


def value_rows(v_cache, v_aux, blk, off, m, g, kv):
    """See the module docstring (overloaded by pool kind)."""
    raise NotImplementedError


@overload(value_rows, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_value_rows(v_cache, v_aux, blk, off, m, g, kv):
    if isinstance(v_aux.dtype, types.Integer):
        def blocks(v_cache, v_aux, blk, off, m, g, kv):
            nb, bs, n_kv, rb = v_cache.shape
            rows = v_cache.reshape(nb * bs * n_kv, rb)
            decode_kv_rows(v_aux[0], rows, (blk * bs + off) * n_kv + g, n_kv, m, kv)
        return blocks

    def plain(v_cache, v_aux, blk, off, m, g, kv):
        hd = v_cache.shape[3]
        vflat, kvf = v_cache.reshape(-1), kv.reshape(-1)
        for u in range(m):
            _widen(kvf, u * hd, vflat, ((blk * v_cache.shape[1] + off + u) * v_cache.shape[2] + g) * hd, hd)
    return plain

