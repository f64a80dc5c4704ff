"""Qwen2.5-VL's vision tower (the `qwen2.5vl_merger` projector) as llama.cpp builds it
(tools/mtmd/models/qwen2vl.cpp, and clip.cpp's inputs for PROJECTOR_TYPE_QWEN25VL).

A tile float32 [3, H, W] (sides multiples of 2 patches) is cut into p x p patches, embedded by
the two temporal conv kernels summed (a still image is both frames; no bias, no learned
positions) and put in the tower's order: each 2 x 2 group of patches together (groups in
raster order, a group's patches row by row), and, with window attention, the groups of each
window of window_size px together (windows in raster order, a window cut at the image's
edge). Then RMS-norm blocks:
    x = x + attn_out(attention(RoPE(q), RoPE(k), v)) + bias;  x = x + down(silu(gate) * up)
with biases on every projection, 2-D RoPE by each patch's row and column
(vision_rope2d.rope_2d_halves) and attention over the whole image in every n_wa_pattern-th
block, within the patch's window in the others. The merger: RMSNorm (v.post_ln), each group's
4 patches concatenated, mm.0 + bias, GELU, mm.2 + bias, and the tokens put back in raster order
of the groups: [H / 2p * W / 2p, text_dim]."""

from __future__ import annotations

import numpy as np

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.backend import EncoderBackend
from edge_infer.models.vision import VisionTower, add_bias, patches
from edge_infer.models.vision_config import QWEN25VL, VisionConfig
from edge_infer.models.vision_rope2d import rope_2d_halves
from edge_infer.models.vision_weights import VisionWeights


def group_order(hp: int, wp: int) -> np.ndarray:
    """int64 [hp * wp]: the raster index of the patch at each place of the 2 x 2 group order."""
    by, bx, dy, dx = np.meshgrid(np.arange(hp // 2), np.arange(wp // 2), np.arange(2), np.arange(2), indexing="ij")
    return ((2 * by + dy) * wp + 2 * bx + dx).reshape(-1)


def window_groups(gh: int, gw: int, side: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(the raster index of the group at each place of the window order int64 [gh * gw], each
    window's (start, end) places) for a gh x gw grid of groups in windows of side x side groups."""
    order: list[int] = []
    spans = []
    for y in range(0, gh, side):
        for x in range(0, gw, side):
            start = len(order)
            order += [(y + dy) * gw + x + dx for dy in range(min(side, gh - y)) for dx in range(min(side, gw - x))]
            spans.append((start, len(order)))
    return np.asarray(order, np.int64), spans


class QwenVisionTower(VisionTower):
    """VisionTower's workspace, products and attention with Qwen2.5-VL's order, blocks and merger."""

    def __init__(self, cfg: VisionConfig, weights: VisionWeights, backend: EncoderBackend) -> None:
        super().__init__(cfg, weights, backend)
        mm0 = weights.head["mm0"]
        self._head_width = max(4 * cfg.d_model, mm0.rows if isinstance(mm0, QMatrix) else 1)

    def _layout(self, hp: int, wp: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
        """(the raster patch at each place of the tower's order, the group order's place of each
        raster group (the merger's output back in raster order), the windows' patch spans)."""
        groups = group_order(hp, wp)
        gh, gw = hp // 2, wp // 2
        if not self.cfg.n_wa_pattern:
            return groups, np.arange(gh * gw), [(0, hp * wp)]
        order, spans = window_groups(gh, gw, max(1, self.cfg.window_size // self.cfg.patch_size // 2))
        places = (order[:, None] * 4 + np.arange(4)).reshape(-1)
        back = np.empty_like(order)
        back[order] = np.arange(order.shape[0])
        return groups[places], back, [(a * 4, z * 4) for a, z in spans]

    def _tower(self, tile: np.ndarray) -> np.ndarray:
        """One tile's hidden states after the final RMSNorm float32 [patches, d_model] (a copy),
        in the tower's order."""
        cfg, w, p = self.cfg, self.w, self.cfg.patch_size
        if tile.ndim != 3 or tile.shape[0] != 3 or tile.shape[1] % (2 * p) or tile.shape[2] % (2 * p):
            raise ValueError(f"a tile of shape {tile.shape}: expected [3, H, W] in multiples of {2 * p}")
        hp, wp = tile.shape[1] // p, tile.shape[2] // p
        n = hp * wp
        order, _, spans = self._layout(hp, wp)
        self._reserve(n)
        h = self.ws.h[:n]
        self._mm(np.ascontiguousarray(patches(tile, p)[order]), (w.patch,), (h,))
        return self._rms_layers(h, order // wp, order % wp, rope_2d_halves, spans if cfg.n_wa_pattern else None)

    def _head(self, x: np.ndarray, hp: int, wp: int) -> np.ndarray:
        """The merger: each 2 x 2 group's rows concatenated, mm.0 + bias, GELU, mm.2 + bias; the
        groups back in raster order."""
        head = self.w.head
        mm0, mm2, b0, b2 = head["mm0"], head["mm2"], head["b0"], head["b2"]
        assert isinstance(mm0, QMatrix) and isinstance(mm2, QMatrix)
        assert isinstance(b0, np.ndarray) and isinstance(b2, np.ndarray)
        up = self._project(x.reshape(x.shape[0] // 4, 4 * x.shape[1]), mm0)
        act = np.empty_like(up)
        self.b.bias_gelu(up, b0, act)
        out = self._project(act, mm2)
        add_bias(out, b2)
        _, back, _ = self._layout(hp, wp)
        return np.ascontiguousarray(out[back])


def vision_tower(cfg: VisionConfig, weights: VisionWeights, backend: EncoderBackend) -> VisionTower:
    """The projector's tower: Qwen2.5-VL's, or the SigLIP / pixtral one."""
    cls = QwenVisionTower if cfg.projector == QWEN25VL else VisionTower
    return cls(cfg, weights, backend)
