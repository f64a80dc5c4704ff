"""Perplexity over a token stream, computed exactly as llama.cpp's `llama-perplexity` does.

The rules (tools/perplexity/perplexity.cpp, `perplexity()`): the whole text is tokenized once
with the vocabulary's special tokens (BOS when the model adds one), then cut into
non-overlapping windows of `ctx` tokens (a short tail is dropped; at least 2 windows' worth of
tokens are required). Each window is scored from an empty cache; when the model adds BOS the
window's first token is replaced by BOS. Only the second half is counted: the predictions at
positions ctx/2 .. ctx-2 (ctx - ctx/2 - 1 of them per window). PPL = exp(mean NLL); its
uncertainty is PPL * sqrt(var(NLL) / (count - 1)), llama.cpp's "+/-" figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edge_infer.errors import InvalidRequest

if TYPE_CHECKING:
    from edge_infer.llm import LLM

ChunkCallback = Callable[[int, float], None]


@dataclass(slots=True)
class PerplexityResult:
    """ppl: exp(mean NLL); ppl_std: its uncertainty; running: the PPL after each chunk."""

    ctx: int
    chunks: int
    tokens_scored: int
    nll: float
    nll2: float
    running: list[float] = field(default_factory=list)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.tokens_scored)

    @property
    def ppl_std(self) -> float:
        n = self.tokens_scored
        mean = self.nll / n
        var = self.nll2 / n - mean * mean
        return self.ppl * math.sqrt(var / (n - 1)) if var > 0 and n > 1 else 0.0


def token_nlls(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """Negative log-likelihood of each target under its row of logits (float64 [n])."""
    rows = np.asarray(logits, dtype=np.float64)
    tgt = np.asarray(targets, dtype=np.int64)
    if rows.ndim != 2 or rows.shape[0] != tgt.shape[0]:
        raise ValueError(f"logits {rows.shape} and targets ({tgt.shape[0]},) do not match")
    peak = rows.max(axis=1)
    lse = peak + np.log(np.exp(rows - peak[:, None]).sum(axis=1))
    return lse - rows[np.arange(len(tgt)), tgt]


def scoring_windows(llm: LLM, tokens: Sequence[int], ctx: int, n_chunks: int | None,
                    what: str = "perplexity") -> list[list[int]]:
    """The windows llama-perplexity scores: consecutive ctx-token slices of `tokens` (a short
    tail dropped), at most n_chunks of them, BOS first when the model adds one; validated."""
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 4:
        raise InvalidRequest(f"ctx must be an integer >= 4, got {ctx!r}")
    if n_chunks is not None and (isinstance(n_chunks, bool) or not isinstance(n_chunks, int) or n_chunks < 1):
        raise InvalidRequest(f"n_chunks must be a positive integer, got {n_chunks!r}")
    toks = [int(t) for t in tokens]
    if len(toks) < 2 * ctx:
        raise InvalidRequest(
            f"{what} with a context of {ctx} needs at least {2 * ctx} tokens; the text has only {len(toks)}"
        )
    limit = llm.plan.max_model_len
    if ctx >= limit:
        raise InvalidRequest(f"ctx {ctx} must be below the maximum context length of {limit} tokens")
    available = len(toks) // ctx
    chunks = available if n_chunks is None else min(n_chunks, available)
    bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
    out = []
    for i in range(chunks):
        window = toks[i * ctx : (i + 1) * ctx]
        if bos is not None:
            window[0] = bos
        out.append(window)
    return out


def perplexity(
    llm: LLM,
    tokens: Sequence[int],
    ctx: int = 512,
    n_chunks: int | None = None,
    on_chunk: ChunkCallback | None = None,
) -> PerplexityResult:
    """Score `tokens` (the whole text, tokenized with special tokens) in windows of `ctx`.

    n_chunks: at most this many windows (None: all that fit). on_chunk(i, running_ppl) is
    called after window i (1-based) is scored.
    """
    windows = scoring_windows(llm, tokens, ctx, n_chunks)
    first = ctx // 2
    result = PerplexityResult(ctx=ctx, chunks=len(windows), tokens_scored=0, nll=0.0, nll2=0.0)
    for i, window in enumerate(windows):
        logits = llm.prompt_logits(window)
        v = token_nlls(logits[first : ctx - 1], window[first + 1 : ctx])
        result.nll += float(v.sum())
        result.nll2 += float((v * v).sum())
        result.tokens_scored += len(v)
        result.running.append(result.ppl)
        if on_chunk is not None:
            on_chunk(i + 1, result.ppl)
    return result
