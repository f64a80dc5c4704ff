"""gemma3n's AltUp and LAuReL, as llama.cpp's src/models/gemma3n.cpp computes them.

AltUp keeps A residual streams [A, N, D]. The first is the scaled token embedding, the others
its projections (altup_proj) rescaled to its magnitude. Before each layer a router reads
stream 0 (tanh(router @ rmsnorm(S_0) / D)) and mixes every stream into a prediction of each;
the layer runs on prediction 0. After it, the router reads the layer's output y and corrects
each prediction by its share of the innovation y - P_0, and the per-layer embedding term of the
corrected stream 0 is added to the other streams. At the end the other streams are mapped back
(altup_unembd_proj, rescaled to stream 0's magnitude) and all are averaged.

LAuReL adds a rank-R path beside attention: x + rmsnorm(laurel_r @ laurel_l @ x), averaged with
the attention's residual output (times 1 / sqrt(2)). All compute goes through the backend, in
the workspace's AltUp buffers."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.per_layer_input import PerLayerInput
from edge_infer.models.weights import LayerWeights, ModelWeights


def _streams(buf: Any, n: int) -> Any:
    """The first n tokens of an [A, T, D] buffer as a contiguous [A, n, D] view."""
    a, _, d = buf.shape
    return buf.reshape(-1)[: a * n * d].reshape(a, n, d)


class AltUp:
    """The AltUp streams of one forward (the workspace's) and the steps that move them."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend, ple: PerLayerInput) -> None:
        self.cfg, self.w, self.b, self.ple = cfg, weights, backend, ple
        self.eps, self.embed_scale = np.float32(cfg.norm_eps), np.float32(cfg.embed_scale)
        self.half = np.float32(1.0 / np.sqrt(2.0))

    def start(self, tokens: Any, h: Any, ws: Any) -> None:
        """The streams of the step's tokens, and layer 0's active prediction into h [N, D]."""
        b, n = self.b, h.shape[0]
        s = _streams(ws.alt_streams, n)
        b.embed(tokens, self.w.token_embd, self.embed_scale, s[0])
        for k, proj in enumerate(self.w.alt_proj, start=1):
            b.matmuls(s[0], (proj,), (s[k],), ws)
            b.match_norm(s[0], s[k])
        self._predict(0, h, ws)

    def _router(self, lw: LayerWeights, x: Any, ws: Any) -> Any:
        """The router's output [N, A] for x [N, D] (the kernels take its tanh)."""
        assert lw.altup is not None and lw.alt_router is not None
        n = x.shape[0]
        normed, r = ws.o2[:n], ws.alt_r[:n]
        self.b.rmsnorm(x, lw.altup.router_norm, self.eps, normed)
        self.b.matmuls(normed, (lw.alt_router,), (r,), ws)
        return r

    def _predict(self, li: int, h: Any, ws: Any) -> None:
        lw, n = self.w.layers[li], h.shape[0]
        assert lw.altup is not None
        s = _streams(ws.alt_streams, n)
        self.b.altup_predict(s, self._router(lw, s[0], ws), lw.altup.predict, _streams(ws.alt_pred, n), h)

    def laurel(self, lw: LayerWeights, x: Any, ws: Any) -> Any:
        """LAuReL's output x + rmsnorm(laurel_r @ laurel_l @ x) [N, D] (in ws.laurel) of the
        layer's normed input x."""
        assert lw.laurel_l is not None and lw.laurel_r is not None and lw.altup is not None
        b, n = self.b, x.shape[0]
        low, wide, out = ws.laurel_low[:n], ws.o2[:n], ws.laurel[:n]
        b.matmuls(x, (lw.laurel_l,), (low,), ws)
        b.matmuls(low, (lw.laurel_r,), (wide,), ws)
        b.rmsnorm(wide, lw.altup.laurel_norm, self.eps, out)
        b.add(out, x)
        return out

    def merge_attention(self, h: Any, attn_out: Any, laurel: Any, ffn_norm: Any, xn: Any) -> Any:
        """h = (h + attn_out + laurel) / sqrt(2), the FFN's input normed into xn (returned)."""
        b = self.b
        b.add(h, attn_out)
        b.add(h, laurel)
        b.scale(h, self.half)
        b.rmsnorm(h, ffn_norm, self.eps, xn)
        return xn

    def end_layer(self, li: int, lw: LayerWeights, h: Any, ws: Any) -> None:
        """After layer li (its output y in h [N, D]): correct the predictions into the streams,
        add the per-layer embedding term to streams 1.., then the next layer's active prediction
        into h, or after the last layer the streams merged back into h."""
        assert lw.altup is not None
        b, n = self.b, h.shape[0]
        s, pred = _streams(ws.alt_streams, n), _streams(ws.alt_pred, n)
        b.altup_correct(pred, h, self._router(lw, h, ws), lw.altup.correct, s)
        pl = self.ple.layer_input(li, ws, self.eps)
        scaled = ws.xn[:n]  # free until the next layer's norm
        b.mul_rows(s[0], lw.altup.correct_scale, scaled)
        term = self.ple.term(li, lw, scaled, pl, ws, self.eps)
        for k in range(1, s.shape[0]):
            b.add(s[k], term)
        if li + 1 < self.cfg.n_layers:
            self._predict(li + 1, h, ws)
            return
        for k, proj in enumerate(self.w.alt_unembed, start=1):
            b.matmuls(s[k], (proj,), (pred[k],), ws)
            b.match_norm(s[0], pred[k])
        b.unembed_mean(s[0], pred, h)
