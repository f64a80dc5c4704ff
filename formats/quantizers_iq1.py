"""Quantizers of IQ1_S and IQ1_M (1.56 and 1.75 bits per weight): what llama-quantize writes,
byte for byte (ggml's `quantize_iq1_s` / `quantize_iq1_m`). IQ1_S needs an importance matrix,
as in llama.cpp; IQ1_M weighs by x^2 without one (llama.cpp refuses to write it so).

The search is quant_fit_iq1.py's over IQ1_S's codebook lattice (grid_lattice.py; IQ1_M shares
it); this module packs the result into the blocks (layouts in weight_types.py). Shapes: blocks
(n, 256) float32, importance the same or None.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from edge_infer.errors import EdgeInferError
from edge_infer.formats.grid_lattice import lattice
from edge_infer.formats.quant_fit_iq1 import fit_iq1m_kernel, fit_iq1s_kernel

F32 = np.float32
_IQ1M_MASKS = np.array([0x00, 0x80, 0x08, 0x88], np.uint8)  # qh's delta bits per shift (bit 3: first 8)


def _tables() -> tuple[np.ndarray, ...]:
    lat = lattice("IQ1_S")
    return lat.levels, lat.code_of, lat.near_start, lat.near_count, lat.near


def _importance(x: np.ndarray, importance: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, F32)
    return x, np.zeros((0, 256), F32) if importance is None else np.ascontiguousarray(importance, F32)


def quantize_iq1_s(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """x (n, 256) float32 super-blocks, importance (n, 256) -> (n, 50) IQ1_S blocks: d f16,
    qs (entry low bytes), qh u16 x 8 (3 high bits per 8 | 3-bit scale << 12 | minus delta << 15)."""
    if importance is None:
        raise EdgeInferError("quantize to IQ1_S: this type needs an importance matrix "
                             "(--imatrix FILE or --calibrate TEXT), as in llama.cpp")
    x, qw = _importance(x, importance)
    n = len(x)
    idx = np.empty((n, 32), np.int32)
    lcode = np.empty((n, 8), np.uint8)
    d = np.empty(n, F32)
    fit_iq1s_kernel(x, qw, _tables(), idx, lcode, d)
    u = idx.astype(np.uint32)
    qh = ((u >> 8).reshape(n, 8, 4) << np.array([0, 3, 6, 9], np.uint32)).sum(axis=2) | (lcode.astype(np.uint32) << 12)
    return np.concatenate([d.astype(np.float16).view(np.uint8).reshape(n, 2), (u & 255).astype(np.uint8),
                           qh.astype("<u2").view(np.uint8)], axis=1)


def quantize_iq1_m(x: np.ndarray, importance: np.ndarray | None = None) -> np.ndarray:
    """x (n, 256) float32 super-blocks [, importance (n, 256)] -> (n, 56) IQ1_M blocks: qs, qh
    (2 x 3 high bits and the two deltas' signs per 16), scales 4 x u16 (four 3-bit scales and
    a nibble of the f16 d each)."""
    x, qw = _importance(x, importance)
    n = len(x)
    idx = np.empty((n, 32), np.int32)
    lcode = np.empty((n, 16), np.uint8)
    shifts = np.empty((n, 16), np.uint8)
    d = np.empty(n, F32)
    fit_iq1m_kernel(x, qw, _tables(), idx, lcode, shifts, d)
    u = idx.astype(np.uint32)
    qh = (u[:, 0::2] >> 8) | ((u[:, 1::2] >> 8) << 4) | _IQ1M_MASKS[shifts]
    dbits = d.astype(np.float16).view(np.uint16).astype(np.uint32)
    sc = (lcode.astype(np.uint32).reshape(n, 4, 4) << np.array([0, 3, 6, 9], np.uint32)).sum(axis=2)
    sc |= ((dbits[:, None] >> (4 * np.arange(4, dtype=np.uint32))) & 15) << 12
    return np.concatenate([(u & 255).astype(np.uint8), qh.astype(np.uint8), sc.astype("<u2").view(np.uint8)], axis=1)


IQ1_QUANTIZERS = {T.IQ1_S: quantize_iq1_s, T.IQ1_M: quantize_iq1_m}
