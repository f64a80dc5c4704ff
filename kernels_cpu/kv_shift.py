"""A context shift's K/V row moves (engine/context_shift.py), as llama.cpp's K-shift does them:
each moved key is read back as float32, rotated by RoPE for its position change (the angle of
`delta` positions: rotations compose, so a key at p rotated by -n is the key at p - n), and
stored again in the pool's type; values move as they are. A quantized K is stored Hadamard-
rotated (kv_quant): it is rotated back first and again after, as llama.cpp's shift does. NumPy:
a shift is rare (once per half a context) and moves at most max_model_len rows per layer.
"""

from __future__ import annotations

import numpy as np

from edge_infer.formats.quantizers import QUANTIZERS
from edge_infer.formats.quantizers_iq4 import quantize_iq4_nl_row_ref
from edge_infer.formats.weight_types import IQ4_NL

from .reference import decode_rows, rope


def hadamard(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix (Sylvester order, kv_quant's), float64."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def _read_keys(k: np.ndarray, aux: np.ndarray, blk: np.ndarray, off: np.ndarray, hd: int) -> np.ndarray:
    """float64 [n, n_kv, hd] keys at (blk, off), unrotated."""
    if aux.dtype != np.int64:  # f16 / f32: blocks transposed [block, head, dim, offset]
        x = k[blk, :, :, off]
        return (x.view(np.float16) if x.dtype == np.uint16 else x).astype(np.float64)
    rows = k[blk, off]
    x = decode_rows(rows.reshape(-1, rows.shape[-1]), int(aux[0])).astype(np.float64)
    if aux[1]:
        r = int(aux[1])
        x = (x.reshape(-1, r) @ hadamard(r)).reshape(x.shape)  # H is its own inverse
    return x.reshape(rows.shape[0], rows.shape[1], hd)


def _write_keys(k: np.ndarray, aux: np.ndarray, blk: np.ndarray, off: np.ndarray, x: np.ndarray) -> None:
    """Store float32 keys [n, n_kv, hd] at (blk, off) in the pool's type (rotated again)."""
    if aux.dtype != np.int64:
        k[blk, :, :, off] = x.astype(np.float16).view(np.uint16) if k.dtype == np.uint16 else x
        return
    flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
    if aux[1]:
        r = int(aux[1])
        flat = (flat.reshape(-1, r) @ hadamard(r)).reshape(flat.shape)
    blocks = flat.astype(np.float32).reshape(-1, 32)
    code = int(aux[0])
    data = quantize_iq4_nl_row_ref(blocks) if code == IQ4_NL else QUANTIZERS[code](blocks)  # type: ignore[index]
    k[blk, off] = data.reshape(x.shape[0], x.shape[1], -1)


def shift_rows(layer: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], moves: np.ndarray, head_dim: int,
               n_rot: int, inv_freq: np.ndarray, neox: bool) -> None:
    """Do one attention layer's moves: int64 [m, 3] (src slot, dst slot, position delta); the
    destinations are never sources (fresh blocks). inv_freq float64 [n_rot / 2] (zeros: a
    layer without RoPE)."""
    k, k_aux, v, v_aux = layer
    bs = v.shape[1]
    src, dst, delta = moves[:, 0], moves[:, 1], moves[:, 2]
    v[dst // bs, dst % bs] = v[src // bs, src % bs]
    same = delta == 0
    sb, so, db, do = src // bs, src % bs, dst // bs, dst % bs
    if same.any():  # the kept rows of the block the shift starts in: copied as they are
        if k_aux.dtype == np.int64:
            k[db[same], do[same]] = k[sb[same], so[same]]
        else:
            k[db[same], :, :, do[same]] = k[sb[same], :, :, so[same]]
    moved = ~same
    if not moved.any():
        return
    x = _read_keys(k, k_aux, sb[moved], so[moved], head_dim)
    n, n_kv = x.shape[0], x.shape[1]
    x = rope(x.reshape(n, n_kv * head_dim).astype(np.float32), n_kv, head_dim, n_rot, delta[moved], inv_freq, neox)
    _write_keys(k, k_aux, db[moved], do[moved], x.reshape(n, n_kv, head_dim))
