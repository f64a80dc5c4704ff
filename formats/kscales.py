"""The packed 6-bit sub-block scales and mins of Q4_K and Q5_K, unpacked: shared by the
dequantizers (quants.py) and the quantizers (quantizers.py), which pack them."""

from __future__ import annotations

import numpy as np

__all__ = ["k4_scale_min"]


def k4_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K scales (n, 12) u8 -> 8 scales and 8 mins, (n, 8) u8 each.
    Bytes 0-3: scale j (6 bits) + top 2 bits of scale j+4; 4-7: min j + top bits of min j+4;
    8-11: lo = low 4 bits of scale j+4, hi = low 4 bits of min j+4."""
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn
