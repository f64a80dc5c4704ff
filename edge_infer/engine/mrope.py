"""M-RoPE positions of a sequence with images (qwen2vl text models with a qwen2.5vl projector),
as libmtmd gives them (mtmd_image_tokens_get_decoder_pos, mtmd_image_tokens_get_n_pos): an
image whose first token would be at text position p0 gives its token at (row y, column x) of
its grid the position (t, h, w) = (p0, p0 + y, p0 + x); the text after it continues at
p0 + max(rows, columns), so text positions fall behind the token index by each image's
tokens less that. A text token's three components are its text position. Attention still
masks by token index: llama.cpp masks equal t positions by (row, column), which is the image's
token order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edge_infer.engine.image_prompt import ImageSpan


def mrope_positions(spans: Sequence[ImageSpan], start: int, m: int) -> np.ndarray:
    """int32 [m, 3]: the (t, h, w) positions of a sequence's tokens start .. start + m - 1."""
    index = np.arange(start, start + m, dtype=np.int64)
    out = np.repeat(index[:, None], 3, axis=1)
    behind = 0  # how far the text position is behind the token index before this span
    for s in spans:  # in position order (a MultimodalPrompt's)
        nx, ny = s.grid
        if nx < 1 or ny < 1 or nx * ny != s.length:
            raise ValueError(f"an image span of {s.length} tokens with a {nx} x {ny} grid has no M-RoPE positions")
        p0 = s.start - behind
        lo, hi = max(start, s.start), min(start + m, s.start + s.length)
        if lo < hi:
            j = np.arange(lo, hi) - s.start
            rows = slice(lo - start, hi - start)
            out[rows, 0] = p0
            out[rows, 1] = p0 + j // nx
            out[rows, 2] = p0 + j % nx
        after = index >= s.start + s.length
        out[after] -= s.length - max(nx, ny)
        behind += s.length - max(nx, ny)
    return out.astype(np.int32)
