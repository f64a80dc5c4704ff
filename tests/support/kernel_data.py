"""Random quantized rows for kernel tests: random bytes with finite, edge-valued scales."""

from __future__ import annotations

import numpy as np
from quant_helpers import random_blocks

from edge_infer.formats.weight_types import weight_type
from edge_infer.kernels_cpu import dequant as dq

# byte offsets of the fp16 scale fields inside one block
F16_SCALE_OFFSETS = {
    dq.Q4_0: (0,), dq.Q4_1: (0, 2), dq.Q5_0: (0,), dq.Q5_1: (0, 2), dq.Q8_0: (0,),
    dq.Q2_K: (80, 82), dq.Q3_K: (108,), dq.Q4_K: (0, 2), dq.Q5_K: (0, 2), dq.Q6_K: (208,),
    dq.IQ4_NL: (0,), dq.IQ4_XS: (0,),
}
EDGE_F16 = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 6.1e-5, 6e-8, 0.01, -0.03], np.float16)


def random_rows(qtype: int, rows: int, cols: int, rng: np.random.Generator, edge: bool = True) -> np.ndarray:
    """uint8 [rows, row_bytes] of valid blocks (finite scales; some scales at edge values)."""
    bs, tb = dq.BLOCK_SHAPE[qtype]
    nblk = rows * cols // bs
    if qtype == dq.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint8)
    if qtype == dq.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16).view(np.uint8)
    if qtype == dq.BF16:
        bits = rng.standard_normal((rows, cols)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    t = weight_type(qtype)
    if not t.quantizer or t.name.startswith(("IQ1", "IQ2", "IQ3")):  # the codebook types: scales in odd places
        return random_blocks(rng, qtype, nblk).reshape(rows, -1)
    raw = rng.integers(0, 256, (nblk, tb), dtype=np.uint8)
    if qtype == dq.Q8_K:
        raw[:, 0:4] = rng.uniform(-0.05, 0.05, (nblk, 1)).astype(np.float32).view(np.uint8)
    for off in F16_SCALE_OFFSETS.get(qtype, ()):
        vals = rng.uniform(-0.05, 0.05, nblk).astype(np.float16)
        if edge:
            pick = rng.random(nblk) < 0.2
            vals[pick] = rng.choice(EDGE_F16, pick.sum())
        raw[:, off : off + 2] = vals.view(np.uint8).reshape(nblk, 2)
    return raw.reshape(rows, -1)
