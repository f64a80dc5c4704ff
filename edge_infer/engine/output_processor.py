"""Tokens -> what the caller sees: incremental detokenization, stop tokens, stop strings and
length limits (the scheduler asks `check_stop` after each token it appends), request metrics,
and the cumulative RequestOutputs of a step."""

from __future__ import annotations

import time
from collections.abc import Iterable

from edge_infer.engine.request import Request
from edge_infer.engine.scheduler import SchedulerOutput
from edge_infer.engine.sequence import Sequence, SequenceStatus
from edge_infer.outputs import RequestOutput

Stop = tuple[SequenceStatus, str | int | None]


class OutputProcessor:
    """Reads the engine's live requests (request id -> Request); eos_ids: the model's
    end-of-generation tokens."""

    def __init__(self, requests: dict[str, Request], eos_ids: tuple[int, ...], max_model_len: int,
                 context_shift: bool = False) -> None:
        """context_shift: a full context is shifted (engine/context_shift.py), not a stop."""
        self.requests, self.eos_ids, self.max_model_len = requests, eos_ids, max_model_len
        self.context_shift = context_shift
        self._now: float | None = None  # read at a step's first token, shared by all its tokens

    def mark_scheduled(self, scheduled: SchedulerOutput) -> None:
        """Start of a step: record when each request was first scheduled, and how many of its
        prompt tokens the prefix cache served then."""
        now = time.monotonic()
        for c in scheduled.chunks:
            req = self.requests.get(c.seq.request_id)
            if req is not None and req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = now
                req.metrics.num_cached_tokens = c.seq.num_cached_tokens

    def check_stop(self, seq: Sequence, tok: int) -> Stop | None:
        """seq has just got token tok: detokenize it and say whether seq is finished."""
        if self._now is None:
            self._now = time.monotonic()
        now = self._now
        req = self.requests[seq.request_id]
        m = req.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        m.num_generated_tokens += 1
        m.token_times.append(now)
        stop = self._stop(seq, tok, req)
        if stop is not None:
            m.finished_time = now
        return stop

    def _stop(self, seq: Sequence, tok: int, req: Request) -> Stop | None:
        p = seq.params
        n_out = seq.num_output_tokens
        detok = seq.detok
        assert detok is not None
        stop_ids = p.stop_token_ids or ()
        if n_out > p.min_tokens - 1 and (tok in stop_ids or (not p.ignore_eos and tok in self.eos_ids)):
            seq.text += detok.flush()  # the stop token's own text is not shown
            return SequenceStatus.FINISHED_STOPPED, tok if tok in stop_ids else None
        new_text = detok.add(tok)
        if p.stop and new_text and n_out >= p.min_tokens:
            hit = self._stop_string(seq, new_text)
            if hit is not None:
                return SequenceStatus.FINISHED_STOPPED, hit
        seq.text += new_text
        if n_out >= req.max_tokens or (seq.num_tokens >= self.max_model_len and not self.context_shift):
            seq.text += detok.flush()
            return SequenceStatus.FINISHED_LENGTH, None
        return None

    def _stop_string(self, seq: Sequence, new_text: str) -> str | None:
        """The stop string that seq's text + new_text now contains (earliest first), with the
        text cut there (kept with include_stop_str_in_output); None when there is none."""
        p = seq.params
        assert p.stop
        longest = max(len(s) for s in p.stop)
        base = max(0, len(seq.text) - longest + 1)
        window = seq.text[base:] + new_text
        best: tuple[int, str] | None = None
        for s in p.stop:
            k = window.find(s)
            if k >= 0 and (best is None or k < best[0]):
                best = (k, s)
        if best is None:
            return None
        k, s = best
        cut = base + k + (len(s) if p.include_stop_str_in_output else 0)
        seq.text = (seq.text + new_text)[:cut]
        return s

    def outputs(self, request_ids: Iterable[str]) -> list[RequestOutput]:
        """The current output of each request (the end of a step); finished requests are
        dropped from the live set."""
        self._now = None
        outs = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None:
                continue
            outs.append(req.output())
            if req.finished:
                del self.requests[rid]
        return outs
