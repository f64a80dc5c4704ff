"""After a forward: sample each sequence's token (or verify its speculative tokens), append,
detokenize, check stops, fork the samples of n > 1 requests, release finished sequences."""

from __future__ import annotations

import time

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.model_runner import StepResult
from edge_infer.engine.request import Request
from edge_infer.engine.sampler import Sampler, apply_penalties, sampling_probs, top_logprobs
from edge_infer.engine.scheduler import Scheduler
from edge_infer.engine.sequence import Sequence, SequenceStatus
from edge_infer.engine.spec_decode import SpecDecoder, verify
from edge_infer.tokenizer import Tokenizer


class Postprocessor:
    def __init__(self, tokenizer: Tokenizer, bm: BlockManager, scheduler: Scheduler, max_model_len: int,
                 spec: SpecDecoder | None = None) -> None:
        self.tok, self.bm, self.scheduler = tokenizer, bm, scheduler
        self.max_model_len = max_model_len
        self.sampler = Sampler(sorted(tokenizer.stop_ids))
        self.spec = spec
        self.last_new_tokens = 0

    def process(self, result: StepResult, requests: dict[str, Request]) -> set[str]:
        """Sample and append; returns the ids of the requests that changed."""
        touched: set[str] = set()
        now = time.monotonic()
        self.last_new_tokens = 0
        i, rows = 0, result.rows
        while i < len(rows):
            seq = rows[i][0]
            j = i + 1
            while j < len(rows) and rows[j][0] is seq:
                j += 1
            first, i = i, j
            req = requests.get(seq.request_id)
            if req is None or seq.is_finished:
                continue
            touched.add(seq.request_id)
            if seq.spec_token_ids:
                self._verify(seq, result.logits[first:j], req, now)
                continue
            logits = result.logits[first]
            if seq.followers:  # n > 1: the prompt is done; every sample starts from these logits
                for f in seq.followers:
                    self.bm.fork(seq, f)
                    f.status = SequenceStatus.RUNNING
                    self.scheduler.running.append(f)
                    self._append(f, logits, req, now)
                seq.followers = []
            self._append(seq, logits, req, now)
        return touched

    def _verify(self, seq: Sequence, logits, req: Request, now: float) -> None:  # type: ignore[no-untyped-def]
        """Accept a prefix of seq's proposals (k + 1 logit rows), append, roll back the rest."""
        assert self.spec is not None
        proposals, seq.spec_token_ids = seq.spec_token_ids, []
        st = self.spec.state(seq)
        stop_ids = self.sampler.stop_ids(seq.params)

        def target(row, accepted):  # type: ignore[no-untyped-def]
            saved = seq.output_token_ids
            seq.output_token_ids = saved + accepted  # penalties see the tokens accepted so far
            try:
                x = apply_penalties(row, seq, stop_ids)
            finally:
                seq.output_token_ids = saved
            return (int(x.argmax()), None) if seq.params.greedy else (None, sampling_probs(x, seq.params))

        res = verify(seq.rng, logits, proposals, st.draft_probs, target)
        emitted = 0
        for r, tok in enumerate(res.tokens):
            lp = top_logprobs(logits[r], tok, seq.params.logprobs) if seq.params.logprobs is not None else None
            self._emit(seq, tok, lp, req, now)
            emitted += 1
            if seq.is_finished:
                break
        if not seq.is_finished:
            self.scheduler.rollback(seq, len(proposals) - res.num_accepted)
        self.spec.finish(seq, len(proposals), res.num_accepted, emitted)
        if seq.is_finished:
            self.spec.release(seq)

    def _append(self, seq: Sequence, logits, req: Request, now: float) -> None:  # type: ignore[no-untyped-def]
        tok, lp = self.sampler.sample_row(logits, seq)
        self._emit(seq, tok, lp, req, now)
        if seq.is_finished and self.spec is not None:
            self.spec.release(seq)

    def _emit(self, seq: Sequence, tok: int, lp: dict[int, float] | None, req: Request, now: float) -> None:
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
