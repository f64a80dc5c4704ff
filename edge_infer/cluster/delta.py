"""Streamed outputs as deltas: an engine replica sends a request's first RequestOutput whole
and then only what each step added (new text, token ids, logprobs per sample; the metrics only
with the last), so a token costs the same to send at the start of a reply as after a long one
(cumulative outputs, a 2,000-token prompt included, were pickled again at every token). The
ingress rebuilds the cumulative RequestOutputs its Stream expects."""

from __future__ import annotations

from dataclasses import dataclass

from edge_infer.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(frozen=True, slots=True)
class SampleDelta:
    """What one sample gained: text and token ids appended (logprobs too, when asked for)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    stop_reason: str | int | None
    cumulative_logprob: float | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class OutputDelta:
    samples: list[SampleDelta]
    finished: bool
    metrics: RequestMetrics | None  # only with the last delta


def diff(prev: RequestOutput, cur: RequestOutput) -> OutputDelta:
    """What cur adds to prev (cur being the same request's later cumulative output)."""
    old = {c.index: c for c in prev.outputs}
    samples = []
    for c in cur.outputs:
        p = old.get(c.index)
        nt, nx = (len(p.token_ids), len(p.text)) if p is not None else (0, 0)
        nl = len(p.logprobs) if p is not None and p.logprobs is not None else 0
        samples.append(SampleDelta(c.index, c.text[nx:], c.token_ids[nt:], c.logprobs[nl:] if c.logprobs is not None else None,
                                   c.finish_reason, c.stop_reason, c.cumulative_logprob, c.error))
    return OutputDelta(samples, cur.finished, cur.metrics if cur.finished else None)


def apply(prev: RequestOutput, d: OutputDelta) -> RequestOutput:
    """The cumulative output after prev plus d (new objects: prev is left as it was)."""
    old = {c.index: c for c in prev.outputs}
    outs = []
    for s in d.samples:
        p = old.get(s.index)
        text, ids = (p.text, p.token_ids) if p is not None else ("", [])
        lps = ((p.logprobs or []) if p is not None else []) + s.logprobs if s.logprobs is not None else (p.logprobs if p is not None else None)
        outs.append(CompletionOutput(s.index, text + s.text, ids + s.token_ids, s.finish_reason, lps, s.stop_reason,
                                     s.cumulative_logprob, s.error))
    return RequestOutput(prev.request_id, prev.prompt, prev.prompt_token_ids, outs, d.finished,
                         d.metrics if d.metrics is not None else prev.metrics)
