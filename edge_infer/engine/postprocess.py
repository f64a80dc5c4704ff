"""After a forward: sample each sequence's token, append it, detokenize, check stops, fork the
samples of n > 1 requests, and release finished sequences."""

from __future__ import annotations

import time

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.model_runner import StepResult
from edge_infer.engine.request import Request
from edge_infer.engine.sampler import Sampler
from edge_infer.engine.scheduler import Scheduler
from edge_infer.engine.sequence import Sequence, SequenceStatus
from edge_infer.tokenizer import Tokenizer


class Postprocessor:
    def __init__(self, tokenizer: Tokenizer, bm: BlockManager, scheduler: Scheduler, max_model_len: int) -> None:
        self.tok, self.bm, self.scheduler = tokenizer, bm, scheduler
        self.max_model_len = max_model_len
        self.sampler = Sampler(sorted(tokenizer.stop_ids))
        self.last_new_tokens = 0

    def process(self, result: StepResult, requests: dict[str, Request]) -> set[str]:
        """Sample and append; returns the ids of the requests that changed."""
        touched: set[str] = set()
        now = time.monotonic()
        self.last_new_tokens = 0
        for i, (seq, _) in enumerate(result.rows):
            req = requests.get(seq.request_id)
            if req is None or seq.is_finished:
                continue
            logits = result.logits[i]
            if seq.followers:  # n > 1: the prompt is done; every sample starts from these logits
                for f in seq.followers:
                    self.bm.fork(seq, f)
                    f.status = SequenceStatus.RUNNING
                    self.scheduler.running.append(f)
                    self._append(f, logits, req, now)
                seq.followers = []
            self._append(seq, logits, req, now)
            touched.add(seq.request_id)
        return touched

    def _append(self, seq: Sequence, logits, req: Request, now: float) -> None:  # type: ignore[no-untyped-def]
        tok, lp = self.sampler.sample_row(logits, seq)
        seq.output_token_ids.append(tok)
        if lp is not None:
            seq.output_logprobs.append(lp)
            seq.cumulative_logprob += lp[tok]
        self.last_new_tokens += 1
        m = req.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        m.num_generated_tokens += 1
        m.token_times.append(now)
        self._check_stop(seq, tok, req)
        if seq.is_finished:
            m.finished_time = now
            self.scheduler.remove(seq)

    def _check_stop(self, seq: Sequence, tok: int, req: Request) -> None:
        p = seq.params
        n_out = seq.num_output_tokens
        stop_tok = n_out > p.min_tokens - 1 and (tok in (p.stop_token_ids or ()) or (not p.ignore_eos and tok in self.sampler.eos_ids))
        if stop_tok:
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = tok if tok in (p.stop_token_ids or ()) else None
            seq.text += seq.detok.flush()  # type: ignore[union-attr]
            return
        new_text = seq.detok.add(tok)  # type: ignore[union-attr]
        if p.stop and new_text and n_out >= p.min_tokens:
            if self._stop_string(seq, new_text):
                return
        seq.text += new_text
        if n_out >= req.max_tokens or seq.num_tokens >= self.max_model_len:
            seq.status = SequenceStatus.FINISHED_LENGTH
            seq.text += seq.detok.flush()  # type: ignore[union-attr]

    def _stop_string(self, seq: Sequence, new_text: str) -> bool:
        p = seq.params
        longest = max(len(s) for s in p.stop)  # type: ignore[union-attr]
        base = max(0, len(seq.text) - longest + 1)
        window = seq.text[base:] + new_text
        best: tuple[int, str] | None = None
        for s in p.stop:  # type: ignore[union-attr]
            k = window.find(s)
            if k >= 0 and (best is None or k < best[0]):
                best = (k, s)
        if best is None:
            return False
        k, s = best
        cut = base + k + (len(s) if p.include_stop_str_in_output else 0)
        seq.text = (seq.text + new_text)[:cut]
        seq.status = SequenceStatus.FINISHED_STOPPED
        seq.stop_reason = s
        return True
