"""Byte packing of K-quant super-blocks (256 elements) from their codes and scales: the one place
the layouts drawn in weight_types.py are written, shared by the reference quantizers (quantizers.py)
and the importance-weighted ones (quantizers_weighted.py).

Shapes: nb super-blocks; L (nb, 256) uint8 codes in element order; dh, mh (nb, 1) float16.
"""

from __future__ import annotations

from typing import cast

import numpy as np


def _crumbs(L: np.ndarray) -> np.ndarray:
    """(nb, 256) 2-bit codes -> (nb, 64): byte 32h + l holds elements 128h + 32j + l at bits 2j."""
    nb = len(L)
    Lr = L.reshape(nb, 2, 4, 32)  # [h, j, l]
    return cast(np.ndarray, sum(Lr[:, :, j] << (2 * j) for j in range(4))).astype(np.uint8).reshape(nb, 64)


def _low_nibbles(L: np.ndarray) -> np.ndarray:
    """(nb, 256) -> (nb, 128): byte 32p + l holds element 64p + l (low) and 64p + 32 + l (high)."""
    nb = len(L)
    Lr = (L & 0x0F).reshape(nb, 4, 2, 32)
    return (Lr[:, :, 0] | (Lr[:, :, 1] << 4)).reshape(nb, 128)


def pack_q2_k(sc: np.ndarray, L: np.ndarray, dh: np.ndarray, mh: np.ndarray) -> np.ndarray:
    """sc (nb, 16) uint8: scale code | min code << 4 per 16 elements; L in 0..3 -> (nb, 84)."""
    return np.hstack([sc, _crumbs(L), dh.view(np.uint8), mh.view(np.uint8)])


def pack_q3_k(ls: np.ndarray, L: np.ndarray, dh: np.ndarray) -> np.ndarray:
    """ls (nb, 16) uint8 6-bit scale codes (stored value + 32); L in 0..7 -> (nb, 110)."""
    nb = len(L)
    packed = np.empty((nb, 12), np.uint8)
    packed[:, :8] = (ls[:, :8] & 0x0F) | ((ls[:, 8:] & 0x0F) << 4)
    packed[:, 8:] = sum((ls[:, 4 * k : 4 * k + 4] >> 4) << (2 * k) for k in range(4))
    hmask = np.packbits(L.reshape(nb, 8, 32) >> 2, axis=1, bitorder="little").reshape(nb, 32)
    return np.hstack([hmask, _crumbs(L & 3), packed, dh.view(np.uint8)])


def pack_k_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: 8 six-bit scale codes and 8 min codes per block (nb, 8) -> (nb, 12)."""
    packed = np.empty((len(ls), 12), np.uint8)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    return packed


def pack_q4_k(dh: np.ndarray, mh: np.ndarray, scales12: np.ndarray, L: np.ndarray) -> np.ndarray:
    """L in 0..15 -> (nb, 144)."""
    return np.hstack([dh.view(np.uint8), mh.view(np.uint8), scales12, _low_nibbles(L)])


def pack_q5_k(dh: np.ndarray, mh: np.ndarray, scales12: np.ndarray, L: np.ndarray) -> np.ndarray:
    """L in 0..31 -> (nb, 176): bit 4 of element 32s + l is bit s of qh[l]."""
    nb = len(L)
    qh = np.packbits(L.reshape(nb, 8, 32) >> 4, axis=1, bitorder="little").reshape(nb, 32)
    return np.hstack([dh.view(np.uint8), mh.view(np.uint8), scales12, qh, _low_nibbles(L)])


def pack_q6_k(sc: np.ndarray, L: np.ndarray, dh: np.ndarray) -> np.ndarray:
    """sc (nb, 16) int8 scales; L in 0..63 (stored value + 32) -> (nb, 210)."""
    nb = len(L)
    Lr = L.reshape(nb, 2, 4, 32)  # [h, k, l] -> element 128h + 32k + l
    ql = (Lr[:, :, :2] & 0x0F) | ((Lr[:, :, 2:] & 0x0F) << 4)
    qh = cast(np.ndarray, sum((Lr[:, :, k] >> 4) << (2 * k) for k in range(4))).astype(np.uint8)
    return np.hstack([ql.reshape(nb, 128), qh.reshape(nb, 64), sc.view(np.uint8), dh.view(np.uint8)])
