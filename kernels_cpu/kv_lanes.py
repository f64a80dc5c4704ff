"""The attention tile's passes over a Q8_0 or Q4_0 KV pool read in place (kernels_cpu.simd_kv),
instead of through a chunk decoded into scratch (kernels_cpu.kv_read): the same floats, so the
same bits. Overloaded by pool kind, so that f16 / f32 pools compile none of it.

    in_place_code(cache, aux)
        the pool's GGML type id where its blocks are read in place (Q8_0, Q4_0), else -1.
    block_scores(scf, width, col, qh, hd, cache, aux, k0, k1, row, rb, ks, nch)
        the scores of rows row..rb-1 (qh's, from column col of the flat scores scf) against
        the chunk(s) of 16 keys starting at key rows k0 (and k1 when nch is 2) of the pool.
    block_values(accf, sc, scf, cache, aux, vbase, hd, ra, rb, col, ja, jb)
        acc[row] += sc[row, col + j] * V[j] for rows ra..rb-1, keys j = ja..jb-1, V[j] the
        pool's row vbase + j.
(Key and value rows are the pool's (token, head) rows: (block * block_size + offset) * kv_heads
+ head.)
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload

from edge_infer.formats.weight_types import Q4_0, Q8_0

from ._jit import HAS_F16C, kernel
from .kv_read import LANES
from .simd_kv import pv_lanes_q, qk_lanes_q


def _is_blocks(aux) -> bool:
    """A block-type pool (kv_quant) on a target that reads it in place: the scales' halves are
    widened in the register, which on x86 needs F16C (elsewhere a call numba's JIT cannot link;
    such a target decodes chunks through kv_read as before)."""
    return isinstance(aux.dtype, types.Integer) and HAS_F16C


def in_place_code(cache, aux):
    """See the module docstring (overloaded by pool kind)."""
    raise NotImplementedError


@overload(in_place_code, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_in_place_code(cache, aux):
    if _is_blocks(aux):
        def blocks(cache, aux):  # no branch: numba's inliner warns of a variable set in one
            ok = np.int64((aux[0] == Q8_0) | (aux[0] == Q4_0))
            return ok * (aux[0] + 1) - 1
        return blocks

    def plain(cache, aux):
        return -1
    return plain


@kernel(inline=True)
def _rows_typed(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, nch, qt):
    """qk_lanes_q for rows row..row+n-1 (n <= 8) with nch and the type qt made literals."""
    if qt == Q8_0:
        if nch == 2:
            _rows_count(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, 2, Q8_0)
        else:
            _rows_count(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, 1, Q8_0)
    elif nch == 2:
        _rows_count(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, 2, Q4_0)
    else:
        _rows_count(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, 1, Q4_0)


@kernel(inline=True)
def _rows_count(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, nch, qt):
    """... and n a literal: all of a decode step's 3, 6 or 7 rows of a kv-head in one call,
    which decodes the keys once."""
    if n == 8:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 8, nch, qt)
    elif n == 7:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 7, nch, qt)
    elif n == 6:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 6, nch, qt)
    elif n == 5:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 5, nch, qt)
    elif n == 4:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 4, nch, qt)
    elif n == 3:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 3, nch, qt)
    elif n == 2:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 2, nch, qt)
    else:
        _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, 1, nch, qt)


@kernel(inline=True)
def _rows_n(scf, width, col, qh, hd, pool, k0, k1, kstride, ks, row, n, nch, qt):
    qk_lanes_q(scf, row * width + col, width, qh, row * hd, hd, pool, k0, k1, kstride, hd, ks, n, nch, qt)


def block_scores(scf, width, col, qh, hd, cache, aux, k0, k1, row, rb, ks, nch):
    """See the module docstring (overloaded by pool kind)."""
    raise NotImplementedError


@overload(block_scores, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_block_scores(scf, width, col, qh, hd, cache, aux, k0, k1, row, rb, ks, nch):
    if not _is_blocks(aux):
        def plain(scf, width, col, qh, hd, cache, aux, k0, k1, row, rb, ks, nch):
            return None
        return plain

    def blocks(scf, width, col, qh, hd, cache, aux, k0, k1, row, rb, ks, nch):
        _scores(scf, width, col, qh, hd, cache.reshape(-1), cache.shape[3], cache.shape[2], k0, k1, row, rb, ks, nch,
                aux[0])
    return blocks


@kernel
def _scores(scf, width, col, qh, hd, pool, rbytes, n_kv, k0, k1, row, rb, ks, nch, qt):
    """block_scores' loop (a call, not inlined: numba's inliner warns of an inlined overload's
    loops)."""
    while row < rb:
        n = min(8, rb - row)
        _rows_typed(scf, width, col, qh, hd, pool, k0 * rbytes, k1 * rbytes, n_kv * rbytes, ks, row, n, nch, qt)
        row += n


@kernel(inline=True)
def _slices_fixed(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, nrow, nsl, qt):
    """_slices with the accumulator rows astride apart."""
    if nrow == 4:
        _slices_rows(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, 4, nsl, qt)
    elif nrow == 3:
        _slices_rows(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, 3, nsl, qt)
    elif nrow == 2:
        _slices_rows(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, 2, nsl, qt)
    else:
        _slices_rows(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, 1, nsl, qt)


@kernel(inline=True)
def _slices_rows(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, nrow, nsl, qt):
    if nsl == 4:
        pv_lanes_q(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, nrow, 4, qt)
    elif nsl == 2:
        pv_lanes_q(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, nrow, 2, qt)
    else:
        pv_lanes_q(accf, a0, astride, scf, w0, width, pool, v0, vstride, d0, nk, nrow, 1, qt)


def block_values(accf, sc, scf, cache, aux, vbase, hd, ra, rb, col, ja, jb):
    """See the module docstring (overloaded by pool kind)."""
    raise NotImplementedError


@overload(block_values, inline="always", jit_options={"cache": True})  # type: ignore[typeddict-unknown-key]
def _ov_block_values(accf, sc, scf, cache, aux, vbase, hd, ra, rb, col, ja, jb):
    if not _is_blocks(aux):
        def plain(accf, sc, scf, cache, aux, vbase, hd, ra, rb, col, ja, jb):
            return None
        return plain

    def blocks(accf, sc, scf, cache, aux, vbase, hd, ra, rb, col, ja, jb):
        _values(accf, scf, sc.shape[1], cache.reshape(-1), cache.shape[3], cache.shape[2], vbase, hd, ra, rb, col, ja,
                jb, aux[0])
    return blocks


@kernel
def _values(accf, scf, width, pool, rbytes, n_kv, vbase, hd, ra, rb, col, ja, jb, qt):
    """block_values' loops (a call, as _scores): up to 4 rows x 4 slices of 16 dimensions a call."""
    stride = n_kv * rbytes
    v0 = vbase * rbytes + ja * stride  # key ja's row
    d0 = 0
    while d0 < hd:
        left = (hd - d0) // LANES
        nsl = 4 if left >= 4 else 2 if left >= 2 else 1
        row = ra
        while row < rb:
            nrow = min(4, rb - row)  # all of a decode step's 3 rows in one call: each decodes the values
            if qt == Q8_0:
                _slices_fixed(accf, row * hd + d0, hd, scf, row * width + col + ja, width, pool, v0, stride, d0, jb - ja,
                              nrow, nsl, Q8_0)
            else:
                _slices_fixed(accf, row * hd + d0, hd, scf, row * width + col + ja, width, pool, v0, stride, d0, jb - ja,
                              nrow, nsl, Q4_0)
            row += nrow
        d0 += nsl * LANES
