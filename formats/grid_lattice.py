"""The lattices the IQ2/IQ3 grid quantizers search (quantizers_grid.py): each codebook entry as
integer levels, the map from a point of the full lattice to its codebook index, and for every
point that is not in the codebook its nearest entries.

A grid type's codebook (gguf-py's, as formats.quants_iq.grid reads it) holds `width` values per
entry from a small set of magnitudes (IQ2: 8, 25, 43; IQ3_XXS: 4, 12, ..., 62; IQ3_S: 1, 3, ...,
15). Level l is a magnitude's rank; the quantizer works on the odd integers 2l + 1, a point of
the lattice is `width` levels packed `level_bits` bits apiece (element i at bit level_bits * i),
as ggml's `iq2xs_init_impl` / `iq3xs_init_impl` index them. Off-codebook points keep the entries
at their `n_rings` smallest squared distances, ordered by (distance, index): the quantizer's
search takes the first best, so the order decides ties as ggml's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

# name -> (levels the quantizer uses (kMaxQ), rings of neighbours kept)
_SHAPES = {"IQ2_XXS": (3, 2), "IQ2_XS": (3, 2), "IQ2_S": (3, 1), "IQ3_XXS": (8, 2), "IQ3_S": (8, 3),
           "IQ1_S": (3, 3)}  # (IQ1_M shares IQ1_S's codebook)


@dataclass(frozen=True, eq=False)
class GridLattice:
    """levels int8 (entries, width): each codebook entry's levels, odd float32 (same shape)
    their values 2l + 1; code_of int32 (2**(width *
    level_bits),): a lattice point's entry or -1; near_start / near_count int32 (same size) and
    near int32 (total,): an off-codebook point's neighbours are near[start : start + count]."""

    name: str
    width: int
    level_bits: int
    n_levels: int
    levels: np.ndarray
    odd: np.ndarray
    code_of: np.ndarray
    near_start: np.ndarray
    near_count: np.ndarray
    near: np.ndarray


def _points(n_levels: int, width: int) -> np.ndarray:
    """Every lattice point with levels below n_levels: (n_levels**width, width) int32."""
    grids = np.meshgrid(*[np.arange(n_levels)] * width, indexing="ij")
    return np.stack([g.reshape(-1) for g in reversed(grids)], axis=1).astype(np.int32)


def _nearest_rings(d2: np.ndarray, rings: int) -> tuple[np.ndarray, np.ndarray]:
    """d2 (points, entries) -> (order (points, entries), count (points,)): entries by (distance,
    index), and how many lie within the `rings` smallest distinct distances."""
    order = np.argsort(d2, axis=1, kind="stable")
    s = np.take_along_axis(d2, order, axis=1)
    new_ring = np.concatenate([np.ones((len(s), 1), bool), s[:, 1:] != s[:, :-1]], axis=1)
    return order, (np.cumsum(new_ring, axis=1) <= rings).sum(axis=1)


@cache
def lattice(name: str) -> GridLattice:
    """The lattice of grid type `name` ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S")."""
    from edge_infer.formats.quants_iq import grid

    n_levels, rings = _SHAPES[name]
    g = grid(name)
    width = g.shape[1]
    level_bits = 2 if width == 8 else 3
    mags = np.unique(g)
    levels = np.searchsorted(mags, g).astype(np.int8)
    shifts = level_bits * np.arange(width)
    code_of = np.full(1 << (level_bits * width), -1, np.int32)
    code_of[(levels.astype(np.int64) << shifts).sum(axis=1)] = np.arange(len(g), dtype=np.int32)
    pts = _points(n_levels, width)
    keys = (pts.astype(np.int64) << shifts).sum(axis=1)
    off = code_of[keys] < 0
    pts, keys = pts[off], keys[off]
    odd_pts, odd_grid = 2 * pts + 1, 2 * levels.astype(np.int32) + 1
    # |p - g|^2 = |p|^2 + |g|^2 - 2 p.g, exact in int64 (points x entries, without a width axis)
    d2 = (odd_pts**2).sum(1)[:, None] + (odd_grid**2).sum(1)[None, :] - 2 * odd_pts.astype(np.int64) @ odd_grid.T
    order, count = _nearest_rings(d2, rings)
    near_start = np.zeros_like(code_of)
    near_count = np.zeros_like(code_of)
    near_count[keys] = count
    near_start[keys] = np.concatenate([[0], np.cumsum(count)[:-1]])
    near = np.concatenate([order[i, : count[i]] for i in range(len(order))]).astype(np.int32)
    odd = (2 * levels.astype(np.float32) + 1).astype(np.float32)
    return GridLattice(name, width, level_bits, n_levels, levels, odd, code_of, near_start, near_count, near)
