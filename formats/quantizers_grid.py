"""Quantizers of the IQ2/IQ3 grid types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S): what
llama-quantize writes, byte for byte (ggml's `quantize_iq2_xxs` ... `quantize_iq3_s`), with or
without an importance matrix. IQ2_XXS and IQ2_XS need one, as in llama.cpp.

The search is quant_fit_grid.py's over grid_lattice.py's tables; this module holds each type's
settings and packs the result into the type's blocks (layouts in weight_types.py). Shapes:
blocks (n, 256) float32, importance the same (each value's importance, the matrix's column
importance repeated per row) or None.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T

from edge_infer.errors import EdgeInferError
from edge_infer.formats.grid_lattice import lattice
from edge_infer.formats.quant_fit_grid import fit_grid_kernel
from edge_infer.formats.weight_types import weight_type

F32 = np.float32


class GridSearch(NamedTuple):
    """One type's settings of ggml's search (quant_fit_grid.py's P and E, in this order)."""

    block: int  # values per scale: 16 or 32
    levels: int  # magnitude levels rounded to (kMaxQ)
    step10: int  # trial scale step, in tenths
    trials: int  # trials each side (0: IQ2_XXS's start, a make_qp_quants fit and 6)
    parity: int  # 1: 7 stored sign bits per 8, an even number of minus signs
    refine: int  # 0: re-round every group; 1: the off-codebook ones if any; 2: all if any
    sigma: int  # sigma2's factor on the mean square
    weights: int  # without an importance: 1 x^2, 2 sigma2 / 4 + x^2 (0: one is needed)
    zero_below: float  # a block whose largest magnitude is below this is all zero (0: only 0)
    d_factor: float  # d's fudge factor before f16


_SETTINGS: dict[T, GridSearch] = {
    T.IQ2_XXS: GridSearch(32, 3, 1, 0, 1, 0, 1, 0, 1e-15, 1.0),
    T.IQ2_XS: GridSearch(16, 3, 1, 9, 1, 1, 1, 0, 1e-15, 1.0),
    T.IQ2_S: GridSearch(16, 3, 1, 9, 0, 1, 2, 2, 1e-8, 0.9875),
    T.IQ3_XXS: GridSearch(32, 8, 2, 15, 1, 1, 2, 1, 1e-8, 1.0125),
    T.IQ3_S: GridSearch(32, 8, 2, 9, 0, 2, 2, 1, 0.0, 1.033),
}
GRID_QUANTIZED = tuple(_SETTINGS)


def _u32_bytes(words: np.ndarray) -> np.ndarray:
    """(n, k) integer words -> (n, 4k) little-endian bytes."""
    return np.ascontiguousarray(words.astype("<u4")).view(np.uint8)


def _nibble_pairs(codes: np.ndarray) -> np.ndarray:
    """(n, 2k) 4-bit codes -> (n, k) bytes, the even one low."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def _pack(t: T, idx: np.ndarray, signs: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The fit's codebook entries, sign bytes, scale codes and d as blocks of type t."""
    n = len(d)
    head = d.astype(np.float16).view(np.uint8).reshape(n, 2)
    idx = idx.astype(np.uint32)
    s = signs.astype(np.uint32)
    sc = sc.astype(np.uint32)
    if t in (T.IQ2_XXS, T.IQ3_XXS):  # entries as bytes; per 32 a u32 of 4 x 7 sign bits | scale << 28
        sw = (s.reshape(n, 8, 4) << np.array([0, 7, 14, 21], np.uint32)).sum(axis=2) | (sc << 28)
        if t == T.IQ2_XXS:
            gw = (idx.reshape(n, 8, 4) << np.array([0, 8, 16, 24], np.uint32)).sum(axis=2)
            body = _u32_bytes(np.stack([gw, sw], axis=2).reshape(n, 16))
        else:
            body = np.concatenate([idx.astype(np.uint8), _u32_bytes(sw)], axis=1)
    elif t == T.IQ2_XS:  # u16 per 8: 9-bit entry | 7 sign bits << 9; 4-bit scales
        q = (idx | (s << 9)).astype("<u2")
        body = np.concatenate([np.ascontiguousarray(q).view(np.uint8), _nibble_pairs(sc)], axis=1)
    elif t == T.IQ2_S:  # entry low bytes, sign bytes, 2 high entry bits x 4 per byte, scales
        qh = ((idx >> 8).reshape(n, 8, 4) << np.array([0, 2, 4, 6], np.uint32)).sum(axis=2)
        body = np.concatenate([(idx & 255).astype(np.uint8), s.astype(np.uint8), qh.astype(np.uint8),
                               _nibble_pairs(sc)], axis=1)
    else:  # IQ3_S: entry low bytes, bit 8 of the 8 entries of each 32 as a byte, signs, scales
        qh = ((idx >> 8).reshape(n, 8, 8) << np.arange(8, dtype=np.uint32)).sum(axis=2)
        body = np.concatenate([(idx & 255).astype(np.uint8), qh.astype(np.uint8), s.astype(np.uint8),
                               _nibble_pairs(sc)], axis=1)
    return np.concatenate([head, body], axis=1)


def quantize_grid(x: np.ndarray, t: T, importance: np.ndarray | None = None) -> np.ndarray:
    """x (n, 256) float32 super-blocks [, importance (n, 256)] -> (n, type_size) blocks of t."""
    g = _SETTINGS[t]
    if importance is None and weight_type(t).needs_importance:  # (its settings have no weights for it)
        raise EdgeInferError(f"quantize to {t.name}: this type needs an importance matrix "
                             "(--imatrix FILE or --calibrate TEXT), as in llama.cpp")
    lat = lattice(t.name)
    tables = (lat.levels, lat.odd, lat.code_of, lat.near_start, lat.near_count, lat.near)
    x = np.ascontiguousarray(x, F32)
    n = len(x)
    qw = np.zeros((0, 256), F32) if importance is None else np.ascontiguousarray(importance, F32)
    idx = np.empty((n, 256 // lat.width), np.int32)
    signs = np.empty((n, 32), np.uint8)
    sc = np.empty((n, 256 // g.block), np.uint8)
    d = np.empty(n, F32)
    bad = np.zeros(n, np.uint8)
    fit_grid_kernel(x, qw, tables, np.array(g[:8], np.int32), np.array(g[8:], F32), idx, signs, sc, d, bad)
    if bad.any():
        raise EdgeInferError(f"quantize to {t.name}: the search left a level pattern off the codebook "
                             f"(super-block {int(np.argmax(bad))}); please report it")
    return _pack(t, idx, signs, sc, d)
