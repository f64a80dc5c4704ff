"""Activation statistics for importance-weighted quantization: the model runs over calibration
text and, for every weight matrix, each input channel's squared activation is summed (an
importance matrix, as llama.cpp's llama-imatrix collects it).

The statistics are taken where the activations meet the weights: a wrapper around the CPU
backend's `matmuls` / `expert_matmuls` sees each product's input x [tokens, channels] and the
QMatrix it multiplies (so its GGUF name), adds sum(x^2) per channel and the token count, then
runs the product unchanged. An expert stack's rows are split by expert (the pairs routed to
expert e are rows offsets[e]..offsets[e+1] of x). The output matrix (the token embedding when
it is tied to it) is left out, as llama-imatrix does without --process-output: the statistics
then match llama-imatrix's entry for entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_infer.errors import InvalidRequest
from edge_infer.formats.imatrix import Imatrix

if TYPE_CHECKING:
    from edge_infer.llm import LLM

SKIP = ("output.weight", "token_embd.weight")  # the output matmul (token_embd when tied), as llama-imatrix


def _sum_sq(x: np.ndarray) -> np.ndarray:
    x64 = np.asarray(x, np.float64)
    return np.einsum("ij,ij->j", x64, x64)


class ActivationRecorder:
    """Installed on a backend object: its matmuls add to `imatrix`, until remove()."""

    def __init__(self, backend: Any, imatrix: Imatrix) -> None:
        if getattr(backend, "name", "cpu") != "cpu":
            raise InvalidRequest("calibration runs on the CPU backend; load the model with device='cpu'")
        self.backend, self.imatrix = backend, imatrix
        self._matmuls, self._expert_matmuls = backend.matmuls, backend.expert_matmuls
        backend.matmuls, backend.expert_matmuls = self.matmuls, self.expert_matmuls

    def remove(self) -> None:
        for attr in ("matmuls", "expert_matmuls"):
            if attr in vars(self.backend):
                delattr(self.backend, attr)

    def matmuls(self, x: np.ndarray, ws: Sequence[Any], outs: Sequence[np.ndarray], work: Any) -> None:
        x2 = None
        for w in ws:
            if w.name in SKIP:
                continue
            x2 = _sum_sq(x) if x2 is None else x2
            self.imatrix.add(w.name, x2, x.shape[0])
        self._matmuls(x, ws, outs, work)

    def expert_matmuls(self, x: np.ndarray, ws: Sequence[Any], outs: Sequence[np.ndarray], work: Any) -> None:
        offsets = np.asarray(work.moe.offsets)
        n_exp = len(offsets) - 1
        for e in range(n_exp):
            lo, hi = int(offsets[e]), int(offsets[e + 1])
            if hi > lo:
                x2 = _sum_sq(x[lo:hi])
                for w in ws:
                    self.imatrix.add(w.name, x2, hi - lo, e, n_exp)
        self._expert_matmuls(x, ws, outs, work)


def collect_imatrix(llm: LLM, tokens: Sequence[int], ctx: int = 512, n_chunks: int | None = None,
                    dataset: str = "", on_chunk: Callable[[int], None] | None = None) -> Imatrix:
    """Run the model over `tokens` (the whole text, tokenized with special tokens) in windows
    of `ctx` tokens, each from an empty cache with BOS first when the model adds one (as
    llama-imatrix), and return the summed statistics. on_chunk(i) after window i (1-based)."""
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 16:
        raise InvalidRequest(f"the calibration window must be at least 16 tokens, got {ctx!r}")
    toks = [int(t) for t in tokens]
    if ctx >= llm.plan.max_model_len:
        raise InvalidRequest(f"calibration window {ctx} must be below the maximum context length {llm.plan.max_model_len}")
    available = len(toks) // ctx
    if available < 1:
        raise InvalidRequest(f"the calibration text has {len(toks)} tokens, fewer than one window of {ctx}")
    chunks = available if n_chunks is None else min(n_chunks, available)
    bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
    im = Imatrix(datasets=[dataset] if dataset else [], chunk_size=ctx)

    def install(engine: Any) -> ActivationRecorder:
        return ActivationRecorder(engine.runner.backend, im)

    recorder = llm.worker.call(install)
    try:
        for i in range(chunks):
            window = toks[i * ctx : (i + 1) * ctx]
            if bos is not None:
                window[0] = bos
            llm.prompt_logits(window)
            im.chunk_count = i + 1
            if on_chunk is not None:
                on_chunk(i + 1)
    finally:
        llm.worker.call(lambda e: recorder.remove())
    return im
