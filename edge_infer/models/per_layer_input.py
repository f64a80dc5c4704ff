"""gemma4's and gemma3n's per-layer embedding input (PLE), as llama.cpp computes it: each layer
l gets its own P-wide input from the token and from the model's first hidden state,

    pl_l = (rmsnorm(W_l x0 / sqrt(D)) * proj_norm + E_l[token] * sqrt(P)) / sqrt(2)

(W_l: layer l's rows of per_layer_model_proj, E_l: its slice of per_layer_token_embd, x0 the
scaled token embedding), and after its FFN adds

    h += rmsnorm(proj @ (gelu(inp_gate @ h) * pl_l)) * post_norm

to the residual stream (gemma3n: from its corrected stream 0, to the other AltUp streams;
models/altup.py). All compute goes through the backend, in the workspace's PLE buffers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights import LayerWeights, ModelWeights


class PerLayerInput:
    """The PLE of one model: its constants, and each step's token rows of the table."""

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend) -> None:
        self.cfg, self.w, self.b = cfg, weights, backend
        self.proj_scale = np.float32(1.0 / math.sqrt(cfg.d_model))
        self.token_scale = np.float32(math.sqrt(cfg.per_layer_input))
        self.mix_scale = np.float32(1.0 / math.sqrt(2.0))
        self.ids = np.empty((cfg.n_layers, 0), np.int32)

    def start(self, tokens: np.ndarray) -> None:
        """A step's table rows: layer l's input of token t is row t * L + l (int32 [L, N])."""
        n_layers = self.cfg.n_layers
        self.ids = tokens.astype(np.int32)[None, :] * np.int32(n_layers) + np.arange(n_layers, dtype=np.int32)[:, None]

    def layer_input(self, li: int, ws: Any, eps: np.float32) -> Any:
        """Layer li's input pl_l [N, P] for every token of the step (in ws.ple_in)."""
        b, n = self.b, self.ids.shape[1]
        assert self.w.ple_embd is not None and self.w.ple_proj_norm is not None
        lw = self.w.layers[li]
        assert lw.ple_in_proj is not None
        x0, pl, tmp, act = ws.x0[:n], ws.ple_in[:n], ws.ple_gate[:n], ws.ple_act[:n]
        b.matmuls(x0, (lw.ple_in_proj,), (tmp,), ws)
        b.scale(tmp, self.proj_scale)
        b.rmsnorm(tmp, self.w.ple_proj_norm, eps, pl)
        b.embed(self.ids[li], self.w.ple_embd, self.token_scale, act)
        b.add(pl, act)
        b.scale(pl, self.mix_scale)
        return pl

    def term(self, li: int, lw: LayerWeights, x: Any, pl: Any, ws: Any, eps: np.float32) -> Any:
        """rmsnorm(proj @ (gelu(inp_gate @ x) * pl)) * post_norm [M, D] (in ws.o2) of x [M, D]."""
        b, m = self.b, x.shape[0]
        assert lw.ple_gate is not None and lw.ple_proj is not None and lw.ple_norm is not None
        gate, act, out, normed = ws.ple_gate[:m], ws.ple_act[:m], ws.o[:m], ws.o2[:m]
        b.matmuls(x, (lw.ple_gate,), (gate,), ws)
        b.gelu_mul(gate, pl, act)
        b.matmuls(act, (lw.ple_proj,), (out,), ws)
        b.rmsnorm(out, lw.ple_norm, eps, normed)
        return normed

    def add(self, li: int, lw: LayerWeights, h: Any, rows: Any, ws: Any, eps: np.float32) -> None:
        """gemma4: h [M, D] += layer li's PLE term of h. rows: None when h holds every token of
        the step, else the token rows h holds (the last layer keeps only the rows whose logits are
        wanted)."""
        pl = self.layer_input(li, ws, eps)
        if rows is not None:
            m = h.shape[0]
            self.b.take_rows(pl, rows, ws.ple_rows[:m])
            pl = ws.ple_rows[:m]
        self.b.add(h, self.term(li, lw, h, pl, ws, eps))
