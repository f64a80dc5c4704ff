"""How far a (quantized) model's next-token distributions are from a reference model's on the
same text, as llama.cpp's `llama-perplexity --kl-divergence` reports it: the mean
KL(reference || model) per token, how often both put the same token first (top-1 agreement),
and both perplexities with their ratio.

The windows and scored positions are perplexity's (bench/perplexity.py): non-overlapping
windows of ctx tokens, BOS first when the model adds one, the second half scored. The two
models run one after the other on each window (never at once: one engine computes at a time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edge_infer.bench.perplexity import scoring_windows
from edge_infer.errors import InvalidRequest

if TYPE_CHECKING:
    from edge_infer.llm import LLM

ROWS = 32  # logit rows turned into log-probabilities at a time (bounds the float64 copies)


@dataclass(slots=True)
class KLResult:
    """Sums over the scored tokens; the properties are the reported figures."""

    ctx: int
    chunks: int
    tokens_scored: int = 0
    kl: float = 0.0
    kl2: float = 0.0
    top1_same: int = 0
    nll_base: float = 0.0
    nll: float = 0.0

    @property
    def mean_kl(self) -> float:
        return self.kl / self.tokens_scored

    @property
    def kl_std(self) -> float:
        """Uncertainty of mean_kl (standard error)."""
        n = self.tokens_scored
        var = self.kl2 / n - self.mean_kl**2
        return math.sqrt(var / (n - 1)) if var > 0 and n > 1 else 0.0

    @property
    def top1(self) -> float:
        return self.top1_same / self.tokens_scored

    @property
    def ppl_base(self) -> float:
        return math.exp(self.nll_base / self.tokens_scored)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.tokens_scored)

    @property
    def ppl_ratio(self) -> float:
        return self.ppl / self.ppl_base

    def as_dict(self) -> dict[str, float | int]:
        return {"ctx": self.ctx, "chunks": self.chunks, "tokens_scored": self.tokens_scored,
                "mean_kl": self.mean_kl, "kl_std": self.kl_std, "top1_agreement": self.top1,
                "ppl": self.ppl, "ppl_base": self.ppl_base, "ppl_ratio": self.ppl_ratio}


def _log_probs(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def add_window(res: KLResult, base_logits: np.ndarray, logits: np.ndarray, targets: Sequence[int]) -> None:
    """Add the rows of one window's scored positions (row i predicts targets[i])."""
    tgt = np.asarray(targets, np.int64)
    for s in range(0, len(tgt), ROWS):
        lb, lm = _log_probs(base_logits[s : s + ROWS]), _log_probs(logits[s : s + ROWS])
        t = tgt[s : s + ROWS]
        kl = (np.exp(lb) * (lb - lm)).sum(axis=1)
        idx = np.arange(len(t))
        res.kl += float(kl.sum())
        res.kl2 += float((kl * kl).sum())
        res.top1_same += int((lb.argmax(axis=1) == lm.argmax(axis=1)).sum())
        res.nll_base -= float(lb[idx, t].sum())
        res.nll -= float(lm[idx, t].sum())
        res.tokens_scored += len(t)


def kl_divergence(llm: LLM, base: LLM, tokens: Sequence[int], ctx: int = 512, n_chunks: int | None = None,
                  on_chunk: Callable[[int, KLResult], None] | None = None) -> KLResult:
    """Compare `llm` with `base` over `tokens` (tokenized with special tokens by llm)."""
    if llm.model_config.vocab_size != base.model_config.vocab_size:
        raise InvalidRequest(f"the models' vocabularies differ ({llm.model_config.vocab_size} vs "
                             f"{base.model_config.vocab_size} tokens): KL divergence needs the same tokenizer")
    limit = min(llm.plan.max_model_len, base.plan.max_model_len)
    if isinstance(ctx, int) and ctx >= limit:
        raise InvalidRequest(f"ctx {ctx} must be below the maximum context length of {limit} tokens")
    windows = scoring_windows(llm, tokens, ctx, n_chunks, "KL divergence")
    first = ctx // 2
    res = KLResult(ctx=ctx, chunks=len(windows))
    for i, window in enumerate(windows):
        b = base.prompt_logits(window)[first : ctx - 1]
        m = llm.prompt_logits(window)[first : ctx - 1]
        add_window(res, b, m, window[first + 1 : ctx])
        if on_chunk is not None:
            on_chunk(i + 1, res)
    return res
