"""VisionTower: a projector file's vision encoder and head as llama.cpp builds them
(tools/mtmd/clip.cpp's build_vit, models/siglip.cpp), through the backend's encoder kernels.

A tile float32 [3, S, S] is cut into p x p patches (raster order), embedded (the patch
convolution as one matmul over each patch's channel, row and column values, plus its bias and
the learned position embedding) and run through pre-norm blocks:
    x = x + attn_out(attention(LN1(x)));  x = x + down(GELU(up(LN2(x))))   then post LayerNorm
where every patch attends to every patch of its own tile (no mask, no KV). The head maps the
patches to text-model tokens:
    idefics3: pixel shuffle (each n x n block of patches concatenated), then mm.model.fc;
    gemma3: n x n average pooling, RMSNorm times mm.soft_emb_norm, then mm.input_projection.
    lfm2: pixel unshuffle (a partial block padded), LayerNorm, mm.1 + bias, GELU, mm.2 + bias,
          over SigLIP2 run at the tile's own size (its position embeddings resized to the grid).
A tile runs alone through the tower: its result never depends on the other tiles or images.
Float weights multiply through NumPy's BLAS and attention is matrix products per head, split
over a pool of threads (see _mm, _attention and vision_blas.py); norms, activations and quantized matmuls are the backend's kernels."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.formats.weight_types import BF16, F16, F32
from edge_infer.models.backend import EncoderBackend
from edge_infer.models.vision_blas import VisionBlas
from edge_infer.models.vision_config import VisionConfig
from edge_infer.models.vision_rope2d import rope_2d
from edge_infer.models.vision_weights import VisionWeights

_EMPTY = np.empty(0, np.float32)


def patches(tile: np.ndarray, p: int) -> np.ndarray:
    """float32 [3, S, S] -> [(S/p)^2, 3 * p * p]: patch (py, px) in raster order, values in
    (channel, row, column) order (ggml's im2col for the patch convolution)."""
    c, h, w = tile.shape
    x = tile.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(x.reshape((h // p) * (w // p), c * p * p), np.float32)


def pixel_shuffle(x: np.ndarray, hp: int, wp: int, s: int) -> np.ndarray:
    """clip_graph::build_patch_merge_permute: [hp * wp, D] patches (raster) -> [ceil(hp/s) *
    ceil(wp/s), s * s * D], row (by, bx) the s x s block's patches concatenated row by row (a
    grid not a multiple of s padded with zeros at the bottom and right, as ggml_pad)."""
    d = x.shape[1]
    ph, pw = -(-hp // s) * s, -(-wp // s) * s
    grid = x.reshape(hp, wp, d)
    if (ph, pw) != (hp, wp):
        grid = np.pad(grid, ((0, ph - hp), (0, pw - wp), (0, 0)))
    y = grid.reshape(ph // s, s, pw // s, s, d).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(y.reshape((ph // s) * (pw // s), s * s * d))


def average_pool(x: np.ndarray, side: int, s: int) -> np.ndarray:
    """ggml_pool_2d(AVG, s, s) over the [side, side] patch grid: [(side/s)^2, D], raster order."""
    d = x.shape[1]
    blocks = x.reshape(side // s, s, side // s, s, d).transpose(0, 2, 1, 3, 4).reshape(-1, s * s, d)
    acc = blocks[:, 0].astype(np.float32).copy()
    for j in range(1, s * s):  # ggml sums the window in order, then divides
        acc += blocks[:, j]
    return np.ascontiguousarray(acc / np.float32(s * s))


class VisionTower:
    """Encodes tiles into text-model embeddings float32 [cfg.tile_tokens(H, W), text_dim] each."""

    def __init__(self, cfg: VisionConfig, weights: VisionWeights, backend: EncoderBackend) -> None:
        self.cfg, self.w, self.b = cfg, weights, backend
        self.blas = VisionBlas(backend, backend.n_threads)
        self._float_layers = all(_on_blas(m) for lw in weights.layers
                                 for m in (lw.wq, lw.wk, lw.wv, lw.wo, lw.w_up, lw.w_down, lw.w_gate) if m is not None)
        self.eps = np.float32(cfg.norm_eps)
        self.scale = np.float32(1.0 / math.sqrt(cfg.head_dim))
        self.capacity = 0
        self._reserve(cfg.n_patches)
        head_in = cfg.d_model * (cfg.n_merge**2 if cfg.projector != "gemma3" else 1)
        mm1 = weights.head.get("mm1")
        self.head_ws: Any = None
        self.head_cap = 0
        self._head_width = max(head_in, mm1.rows if isinstance(mm1, QMatrix) else 1)

    def _reserve(self, n: int) -> None:
        """The tower's workspace for n patches (grown, never shrunk)."""
        if n > self.capacity:
            cfg = self.cfg
            self.capacity = n
            self.ws = self.b.make_workspace(n, cfg.d_model, cfg.d_model, cfg.d_model, cfg.ffn_dim)

    def _mm(self, x: np.ndarray, ms: tuple[QMatrix, ...], outs: tuple[np.ndarray, ...]) -> None:
        """outs[i] = x @ ms[i].T: float matrices (F32, F16, BF16) through NumPy's BLAS (sgemm on
        a tile's thousand rows runs about twice the backend's float kernel here), quantized
        ones through the backend's int8 / K-quant kernels."""
        rest = [(m, o) for m, o in zip(ms, outs) if not _on_blas(m)]
        for m, o in zip(ms, outs):
            if _on_blas(m):  # F16 / BF16 widened to float32 first
                w = m.data.view(np.float32).reshape(m.rows, m.cols) if m.qtype == F32 else self.blas.widened(m)
                self.blas.matmul(x, w.T, o)
        if rest:
            work = self.ws if x.shape[1] <= max(self.cfg.d_model, self.cfg.ffn_dim) else self._head_workspace(x.shape[0])
            self.b.matmuls(x, tuple(m for m, _ in rest), tuple(o for _, o in rest), work)

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
        """Every patch of the tile over every patch, per head: softmax(q k^T * scale) v as float32
        matrix products (BLAS, through NumPy: the backend's per-query attention kernel is sized
        for short texts, and a tile is a thousand patches), the heads over the pool's threads."""
        # (q * scale) . k: a pass over [n, hd], not over [n, n]
        self.blas.attention(q * self.scale, k, v, out, self.cfg.n_heads, self.cfg.head_dim)

    def _head_workspace(self, n: int) -> Any:
        if n > self.head_cap:  # the head's inputs are wider than the tower's: a workspace of their own
            self.head_cap = n
            self.head_ws = self.b.make_workspace(n, self._head_width, 1, 1, 1)
        return self.head_ws

    def encode(self, tiles: list[np.ndarray]) -> list[np.ndarray]:
        """Each tile float32 [3, H, W] -> its embeddings float32 [tile_tokens(H, W), text_dim], one
        tile per forward: its BLAS shapes, so its bits, never depend on the other tiles."""
        p = self.cfg.patch_size
        # the pool's threads split the products (vision_blas); a tower whose matrices are all
        # BLAS's runs the backend's kernels (norms, GELU) on this thread alone, as numba's
        # threads spinning after them took the cores from the pool's products
        kernel_threads = 1 if self._float_layers else self.b.n_threads
        with self.blas.one_thread_each(), self.b.kernel_threads(kernel_threads):
            return [self._head(self._tower(t), t.shape[1] // p, t.shape[2] // p) for t in tiles]

    def close(self) -> None:
        """Stop the products' pool threads."""
        self.blas.close()

    def _positions(self, hp: int, wp: int) -> np.ndarray:
        """The position embeddings of an hp x wp patch grid: the file's table (its own size),
        or, for lfm2 (SigLIP2 at any size), the table resized to the grid."""
        cfg, table = self.cfg, self.w.positions
        if cfg.projector == "lfm2":
            from edge_infer.models.vision_positions import resize_positions

            return resize_positions(table, wp, hp)
        if hp * wp != table.shape[0]:
            raise ValueError(f"a {hp}x{wp} patch grid for a {cfg.projector} tower of {table.shape[0]} positions")
        return table

    def _tower(self, tile: np.ndarray) -> np.ndarray:
        """One tile's post-LayerNorm hidden states float32 [patches, d_model] (a copy)."""
        cfg, b, w, eps, p = self.cfg, self.b, self.w, self.eps, self.cfg.patch_size
        if tile.ndim != 3 or tile.shape[0] != 3 or tile.shape[1] % p or tile.shape[2] % p:
            raise ValueError(f"a tile of shape {tile.shape}: expected [3, H, W] in multiples of {p}")
        hp, wp = tile.shape[1] // p, tile.shape[2] // p
        n = hp * wp
        self._reserve(n)
        ws = self.ws
        h, xn, o = ws.h[:n], ws.xn[:n], ws.o[:n]
        self._mm(patches(tile, p), (w.patch,), (h,))
        if w.patch_bias.size:  # (conv + bias) + position, as ggml adds them
            b.add(h, np.ascontiguousarray(np.broadcast_to(w.patch_bias, h.shape)))
        if not cfg.rope_theta:  # learned positions (pixtral rotates Q and K instead)
            b.add(h, np.ascontiguousarray(self._positions(hp, wp), np.float32))
        if cfg.norm == "rms":
            return self._rms_layers(h, np.arange(n) // wp, np.arange(n) % wp)
        if w.pre_norm is not None:
            b.layernorm(h, w.pre_norm.w, w.pre_norm.b, eps, o)
            h[:] = o
        b.layernorm(h, w.layers[0].ln1.w, w.layers[0].ln1.b, eps, xn)
        for i, lw in enumerate(w.layers):
            q, k, v, attn = ws.q[:n], ws.k[:n], ws.v[:n], ws.attn[:n]
            self._mm(xn, (lw.wq, lw.wk, lw.wv), (q, k, v))
            q += lw.bq  # the biases (rows of a tile: a NumPy add is cheaper than a kernel launch)
            k += lw.bk
            v += lw.bv
            self._attention(q, k, v, attn)
            self._mm(attn, (lw.wo,), (o,))
            b.add_layernorm(o, lw.bo, h, lw.ln2.w, lw.ln2.b, eps, xn)  # o: the residual after attention
            up, act = ws.up[:n], ws.act[:n]
            self._mm(xn, (lw.w_up,), (up,))
            b.bias_gelu(up, lw.b_up, act)
            self._mm(act, (lw.w_down,), (h,))
            nxt = w.layers[i + 1].ln1 if i + 1 < len(w.layers) else w.post_norm
            if nxt is not None:  # h = down + bias + residual, then the next norm into xn
                b.add_layernorm(h, lw.b_down, o, nxt.w, nxt.b, eps, xn)
            else:
                b.add(h, np.ascontiguousarray(np.broadcast_to(lw.b_down, h.shape)))
                b.add(h, o)
        return np.array(xn if w.post_norm is not None else h)

    def _rms_layers(self, h: np.ndarray, rows: np.ndarray, cols: np.ndarray, rope: Callable[..., None] = rope_2d,
                    windows: list[tuple[int, int]] | None = None) -> np.ndarray:
        """pixtral's and qwen2.5vl's blocks: RMSNorms, `rope` on Q and K by the patches' rows and
        columns (int [n]), attention over the tile (with `windows`, the (start, end) runs of each
        window's patches: within them, but in every n_wa_pattern-th block), a SwiGLU MLP, and
        the projections' biases where the file has them; the final hidden states (a copy)."""
        cfg, b, ws, w, eps, n = self.cfg, self.b, self.ws, self.w, self.eps, h.shape[0]
        xn, o = ws.xn[:n], ws.o[:n]
        if w.pre_norm is not None:
            b.rmsnorm(h, w.pre_norm.w, eps, o)
            h[:] = o
        b.rmsnorm(h, w.layers[0].ln1.w, eps, xn)
        for i, lw in enumerate(w.layers):
            q, k, v, attn = ws.q[:n], ws.k[:n], ws.v[:n], ws.attn[:n]
            self._mm(xn, (lw.wq, lw.wk, lw.wv), (q, k, v))
            for m, bias in ((q, lw.bq), (k, lw.bk), (v, lw.bv)):
                add_bias(m, bias)
            rope(q, cfg.head_dim, rows, cols, cfg.rope_theta)
            rope(k, cfg.head_dim, rows, cols, cfg.rope_theta)
            spans = [(0, n)] if windows is None or (i + 1) % cfg.n_wa_pattern == 0 else windows
            for a, z in spans:  # a window's patches attend within it
                self._attention(q[a:z], k[a:z], v[a:z], attn[a:z])
            self._mm(attn, (lw.wo,), (o,))
            add_bias(o, lw.bo)
            b.add_rmsnorm(h, o, lw.ln2.w, eps, xn)  # h += attention; xn = RMSNorm(h) * ln2
            gate, up, act = ws.gate[:n], ws.up[:n], ws.act[:n]
            assert lw.w_gate is not None
            self._mm(xn, (lw.w_gate, lw.w_up), (gate, up))
            add_bias(gate, lw.b_gate)
            add_bias(up, lw.b_up)
            b.silu_mul(gate, up, act)
            self._mm(act, (lw.w_down,), (o,))
            add_bias(o, lw.b_down)
            nxt = w.layers[i + 1].ln1 if i + 1 < len(w.layers) else w.post_norm
            if nxt is not None:
                b.add_rmsnorm(h, o, nxt.w, eps, xn)
            else:
                b.add(h, o)
        return np.array(xn if w.post_norm is not None else h)

    def _pixtral_head(self, x: np.ndarray, hp: int, wp: int) -> np.ndarray:
        """(Mistral Small 3.1: RMSNorm, each s x s block of patches unfolded channel-major as
        torch's unfold, projected by the patch merger,) then mm.1 + bias, GELU, mm.2 + bias per
        token, then [IMG_BREAK] after each row but the last."""
        head, s = self.w.head, self.cfg.n_merge
        if "merger" in head:
            normed = np.empty_like(x)
            self.b.rmsnorm(x, _arr(head["norm_w"]), self.eps, normed)
            d = x.shape[1]
            blocks = normed.reshape(hp // s, s, wp // s, s, d).transpose(0, 2, 4, 1, 3)  # [by, bx, c, dy, dx]
            hp, wp = hp // s, wp // s
            x = self._project(np.ascontiguousarray(blocks.reshape(hp * wp, d * s * s)), _mat(head["merger"]))
        up = self._project(x, _mat(head["mm1"]))
        act = np.empty_like(up)
        self.b.bias_gelu(up, _arr(head["b1"]), act)
        y = self._project(act, _mat(head["mm2"]))
        if _arr(head["b2"]).size:
            self.b.add(y, np.ascontiguousarray(np.broadcast_to(_arr(head["b2"]), y.shape)))
        brk = _arr(head["img_break"])
        rows = np.concatenate([y.reshape(hp, wp, -1), np.broadcast_to(brk, (hp, 1, brk.shape[0]))], axis=1)
        return np.ascontiguousarray(rows.reshape(hp * (wp + 1), -1)[:-1], np.float32)

    def _head(self, x: np.ndarray, hp: int, wp: int) -> np.ndarray:
        """One tile's hidden states [hp * wp, d_model] -> float32 [tokens, text_dim]."""
        cfg, b, head, s = self.cfg, self.b, self.w.head, self.cfg.n_merge
        if cfg.projector == "pixtral":
            return self._pixtral_head(x, hp, wp)
        if cfg.projector == "gemma3":
            pooled = average_pool(x, hp, s)
            normed = np.empty_like(pooled)
            b.rmsnorm(pooled, _arr(head["soft_norm"]), self.eps, normed)
            return self._project(normed, _mat(head["proj"]))
        merged = pixel_shuffle(x, hp, wp, s)
        if cfg.projector == "idefics3":
            return self._project(merged, _mat(head["fc"]))
        if "norm_w" in head:  # lfm2: nn.LayerNorm's default eps
            normed = np.empty_like(merged)
            b.layernorm(merged, _arr(head["norm_w"]), _arr(head["norm_b"]), np.float32(1e-5), normed)
            merged = normed
        up = self._project(merged, _mat(head["mm1"]))
        act = np.empty_like(up)
        b.bias_gelu(up, _arr(head["b1"]), act)
        out = self._project(act, _mat(head["mm2"]))
        b.add(out, np.ascontiguousarray(np.broadcast_to(_arr(head["b2"]), out.shape)))
        return out

    def _project(self, x: np.ndarray, m: QMatrix) -> np.ndarray:
        out = np.empty((x.shape[0], m.rows), np.float32)
        self._mm(np.ascontiguousarray(x), (m,), (out,))
        return out


def _on_blas(m: QMatrix) -> bool:
    """A float matrix (F32, F16, BF16) not repacked by the backend: NumPy's BLAS multiplies it."""
    return m.packed is None and m.qtype in (F32, F16, BF16)


def add_bias(x: np.ndarray, bias: np.ndarray) -> None:
    """x += bias per row, when the file has the bias (NumPy: a tile's rows, cheaper than a launch)."""
    if bias.size:
        x += bias


def _arr(a: Any) -> np.ndarray:
    assert isinstance(a, np.ndarray)
    return a


def _mat(m: Any) -> QMatrix:
    assert isinstance(m, QMatrix)
    return m
