"""Reference (NumPy) dequantizers of the non-linear and codebook types: IQ4_NL, IQ4_XS, the
IQ2/IQ3/IQ1 grid types, the ternary TQ1_0/TQ2_0 and MXFP4. Bit-exact with ggml's
`dequantize_row_*` (and so with gguf-py): each float32 comes from the same operations in the
same order, e.g. IQ2_XXS is `((d * (0.5 + s)) * 0.25) * grid`, its sign applied last.

The codebooks (the grids of 8 or 4 magnitudes per index) are gguf-py's (`gguf.quants`), which
unpacks ggml's tables; the sign tables are built here. Block layouts are drawn in
weight_types.py; each function takes structured blocks (n,) and fills out (n, block_size).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np

from edge_infer.formats.weight_types import IQ4_TABLE, MXFP4_TABLE

IQ4_VALUES = np.array(IQ4_TABLE, np.int8)  # weight_types' tables as arrays
MXFP4_VALUES = np.array(MXFP4_TABLE, np.int8)
IQ1_DELTA = np.float32(0.125)  # IQ1_S / IQ1_M: each grid value is shifted by +-delta
# a sign bit -> the factor ggml multiplies by (a multiply, not a negation: a NaN keeps its sign)
_PLUS_MINUS = np.array([1, -1], np.float32)


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


@cache
def grid(name: str) -> np.ndarray:
    """The codebook of grid type `name` ("IQ2_XXS", ...): (entries, 8 or 4) float32 values.
    "IQ1_DELTA": IQ1's grid with its delta folded in as integers, (4096, 8): entry i is
    8 * grid[i % 2048] + 1, or - 1 from 2048 on (the K-quant kernel's IQ1_S / IQ1_M codes)."""
    if name == "IQ1_DELTA":
        g8 = 8 * grid("IQ1_S")
        return np.concatenate([g8 + 1, g8 - 1]).astype(np.float32)
    import gguf.quants as gq

    cls = getattr(gq, name)
    cls.init_grid()
    g = np.asarray(cls.grid, np.float32)
    return g.reshape(g.shape[-2], g.shape[-1])


@cache
def sign_patterns() -> np.ndarray:
    """(128, 8) float32 of +-1: IQ2/IQ3's 7 stored sign bits of 8 values, the 8th the parity of
    the 7 (ggml's ksigns_iq2xs, an even number of minus signs)."""
    i = np.arange(128)
    bits = (i[:, None] >> np.arange(7)) & 1
    signs = np.concatenate([bits, bits.sum(1, keepdims=True) & 1], axis=1)
    return np.where(signs == 1, np.float32(-1), np.float32(1)).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) u8 -> (n, 2k): the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _signed_grid(db: np.ndarray, idx: np.ndarray, sign_idx: np.ndarray, name: str) -> np.ndarray:
    """(db * grid[idx]) with the sign pattern applied: db (n, groups), idx/sign_idx (n, groups)
    -> (n, groups * 8). For 4-wide grids idx is (n, 2 * groups): two grid rows per 8 values."""
    g = grid(name)
    vals = g[idx].reshape(idx.shape[0], sign_idx.shape[1], 8)
    out = db[:, :, None] * vals
    return (out * sign_patterns()[sign_idx]).reshape(idx.shape[0], -1)


def _scale_half(d: np.ndarray, s: np.ndarray, last: float) -> np.ndarray:
    """ggml's `d * (0.5f + s) * last` (s a 4-bit scale), rounded as it rounds."""
    return (_f32(d)[:, None] * (np.float32(0.5) + _f32(s))) * np.float32(last)


def _dq_iq2_xxs(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    q = np.ascontiguousarray(b["qs"]).view(np.uint32).reshape(n, 8, 2)  # two u32 per 32 values
    idx = np.ascontiguousarray(q[:, :, 0]).view(np.uint8).reshape(n, 8, 4)  # grid rows (one byte each)
    aux = q[:, :, 1]
    db = _scale_half(b["d"], aux >> 28, 0.25)
    signs = (aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    out[:] = _signed_grid(np.repeat(db, 4, axis=1), idx.reshape(n, 32), signs.reshape(n, 32), "IQ2_XXS")


def _dq_iq2_xs(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    qs = b["qs"].astype(np.int64)  # (n, 32) u16: 9-bit grid row, 7 sign bits
    sc = b["scales"]
    db = np.stack([_scale_half(b["d"], sc & 0x0F, 0.25), _scale_half(b["d"], sc >> 4, 0.25)], axis=2)
    db = np.repeat(db, 2, axis=2).reshape(n, 32)  # rows l = 0, 1 take the low scale, 2, 3 the high
    out[:] = _signed_grid(db, qs & 511, qs >> 9, "IQ2_XS")


def _dq_iq2_s(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    qs = b["qs"][:, :32].reshape(n, 8, 4).astype(np.int64)
    qh = b["qh"].astype(np.int64)[:, :, None]
    idx = qs | ((qh << (8 - 2 * np.arange(4))) & 0x300)
    signs = b["qs"][:, 32:].reshape(n, 32).astype(np.int64)  # all 8 sign bits stored
    sc = b["scales"]
    db = np.stack([_scale_half(b["d"], sc & 0x0F, 0.25), _scale_half(b["d"], sc >> 4, 0.25)], axis=2)
    db = np.repeat(db, 2, axis=2).reshape(n, 32)
    vals = db[:, :, None] * grid("IQ2_S")[idx.reshape(n, 32)]
    out[:] = (vals * _PLUS_MINUS[(signs[:, :, None] >> np.arange(8)) & 1]).reshape(n, 256)


def _dq_iq3_xxs(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    idx = b["qs"][:, :64].reshape(n, 64)  # 4-wide grid rows, two per 8 values
    aux = np.ascontiguousarray(b["qs"][:, 64:]).view(np.uint32).reshape(n, 8)
    db = _scale_half(b["d"], aux >> 28, 0.5)
    signs = (aux[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    out[:] = _signed_grid(np.repeat(db, 4, axis=1), idx, signs.reshape(n, 32), "IQ3_XXS")


def _dq_iq3_s(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    qs = b["qs"].reshape(n, 8, 8).astype(np.int64)  # per 32 values: 8 grid rows of 4
    qh = b["qh"].astype(np.int64)[:, :, None]  # bit k of qh[ib]: bit 8 of row k
    idx = qs | (((qh >> np.arange(8)) & 1) << 8)
    sc = b["scales"].astype(np.int64)
    s = np.stack([sc & 0x0F, sc >> 4], axis=2).reshape(n, 8)  # one per 32 values
    db = _f32(b["d"])[:, None] * _f32(1 + 2 * s)
    vals = db[:, :, None] * grid("IQ3_S")[idx.reshape(n, 64)].reshape(n, 8, 32)
    bits = (b["signs"].reshape(n, 8, 4, 1).astype(np.int64) >> np.arange(8)) & 1
    out[:] = (vals * _PLUS_MINUS[bits.reshape(n, 8, 32)]).reshape(n, 256)


def _iq1(dl: np.ndarray, idx: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """dl (n, groups) * (grid[idx] + +-delta): idx, negative (n, groups); 8 values a group."""
    delta = np.where(negative, -IQ1_DELTA, IQ1_DELTA).astype(np.float32)
    return (dl[:, :, None] * (grid("IQ1_S")[idx] + delta[:, :, None])).reshape(len(dl), -1)


def _dq_iq1_s(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    qh = b["qh"].astype(np.int64)  # (n, 8): per 32 values 4 x 3 index bits, a 3-bit scale, a sign
    qs = b["qs"].reshape(n, 8, 4).astype(np.int64)
    idx = qs | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)
    dl = _f32(b["d"])[:, None] * _f32(2 * ((qh >> 12) & 7) + 1)
    neg = np.repeat((qh & 0x8000) != 0, 4, axis=1)
    out[:] = _iq1(np.repeat(dl, 4, axis=1), idx.reshape(n, 32), neg)


def iq1m_scale(words: np.ndarray) -> np.ndarray:
    """IQ1_M's f16 super-block scale, spread over the top 4 bits of its four u16 scale words
    ([..., 4], word 0's the lowest): float16 [...]."""
    w = words.astype(np.int64)
    d16 = (w[..., 0] >> 12) | ((w[..., 1] >> 8) & 0x00F0) | ((w[..., 2] >> 4) & 0x0F00) | (w[..., 3] & 0xF000)
    return d16.astype(np.uint16).view(np.float16)


def _dq_iq1_m(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    sc = np.ascontiguousarray(b["scales"]).view(np.uint16).reshape(n, 4).astype(np.int64)
    d = iq1m_scale(sc)
    s = (sc[:, :, None] >> np.array([0, 3, 6, 9])) & 7  # (n, 4 words, 4): per 16 values
    dl = _f32(d)[:, None] * _f32(2 * s.reshape(n, 16) + 1)
    qs = b["qs"].reshape(n, 16, 2).astype(np.int64)
    qh = b["qh"].astype(np.int64)[:, :, None]  # one byte per 16 values: two groups of 8
    idx = qs | ((qh << np.array([8, 4])) & 0x700)
    neg = (qh & np.array([0x08, 0x80])) != 0
    out[:] = _iq1(np.repeat(dl, 2, axis=1), idx.reshape(n, 32), neg.reshape(n, 32))


def _dq_iq4_nl(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_f32(b["d"])[:, None], _f32(IQ4_VALUES[_nibbles(b["qs"])]), out=out)


def _dq_iq4_xs(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    ib = np.arange(8)
    lo = (b["scales_l"][:, ib // 2] >> (4 * (ib % 2))) & 0x0F
    hi = (b["scales_h"][:, None].astype(np.int64) >> (2 * ib)) & 3
    dl = _f32(b["d"])[:, None] * _f32((lo | (hi << 4)).astype(np.int64) - 32)  # (n, 8)
    q = _nibbles(b["qs"].reshape(n * 8, 16)).reshape(n, 8, 32)
    np.multiply(dl[:, :, None], _f32(IQ4_VALUES[q]), out=out.reshape(n, 8, 32))


def _trits(q: np.ndarray, n_trits: int) -> np.ndarray:
    """(n, k) u8 of base-3 digits stored as ggml's TQ1_0 (a byte scaled by 256/243) -> (n,
    n_trits, k) int: digit t of each byte, most significant first."""
    pow3 = np.array([1, 3, 9, 27, 81][:n_trits], np.uint8)
    scaled = (q[:, None, :] * pow3[None, :, None]).astype(np.uint8)  # wraps mod 256, as in C
    return (scaled.astype(np.uint16) * 3) >> 8


def _dq_tq1_0(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    qs = b["qs"]
    parts = [_trits(qs[:, :32], 5).reshape(n, 160), _trits(qs[:, 32:48], 5).reshape(n, 80),
             _trits(b["qh"], 4).reshape(n, 16)]
    np.multiply(_f32(np.concatenate(parts, axis=1).astype(np.int16) - 1), _f32(b["d"])[:, None], out=out)


def _dq_tq2_0(b: np.ndarray, out: np.ndarray) -> None:
    n = len(b)
    qs = b["qs"].reshape(n, 2, 1, 32)
    q = (qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    np.multiply(_f32(q.reshape(n, 256).astype(np.int8) - 1), _f32(b["d"])[:, None], out=out)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """MXFP4's E8M0 scale byte -> 2^(e - 128) as float32 (half the scale: the values are doubled),
    with ggml's subnormals for e < 2."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23)
    return bits.astype(np.uint32).view(np.float32)


def _dq_mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    np.multiply(_f32(MXFP4_VALUES[_nibbles(b["qs"])]), e8m0_half(b["e"])[:, None], out=out)


# keyed by GGML type id (formats.weight_types)
DEQUANT_IQ: dict[int, Callable[[np.ndarray, np.ndarray], None]] = {
    16: _dq_iq2_xxs, 17: _dq_iq2_xs, 18: _dq_iq3_xxs, 19: _dq_iq1_s, 20: _dq_iq4_nl, 21: _dq_iq3_s,
    22: _dq_iq2_s, 23: _dq_iq4_xs, 29: _dq_iq1_m, 34: _dq_tq1_0, 35: _dq_tq2_0, 39: _dq_mxfp4,
}
