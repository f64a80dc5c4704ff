"""Context shift (`context_shift=True`, `--context-shift`), as llama.cpp's: when a generating
sequence's context is full, keep its first tokens, drop about half of the rest, and go on.

With context_keep set (llama.cpp's --keep) the rule is llama.cpp server's, so that the tokens
after a shift are the ones llama.cpp gives: when the context holds max_model_len - 1 computed
tokens and the next one is waiting, n_keep = context_keep + 1 for the model's BOS, at most
max_model_len - 4, and the n_discard = (computed - n_keep) / 2 tokens after the first n_keep are
dropped. Without it (None, the default) a chat keeps its first message (the system prompt) and
drops whole messages: n_keep is where its second message begins (ChatTemplate.message_starts,
at most max_model_len - 4), and n_discard reaches the message start nearest llama.cpp's half
among those between a quarter and three quarters of the tokens after n_keep (the oldest whole
messages, about as many tokens as llama.cpp drops), or is llama.cpp's half where no start lies
there (a reply longer than half the context); a prompt that is not a chat keeps BOS. The later
tokens move down n_discard positions: their K/V are kept as computed (not recomputed), the keys
rotated by RoPE for the new positions (kernels_cpu.kv_shift), in new blocks from the block
holding position n_keep on (BlockManager.shift), which are never prefix-cached. The request's
outputs are never shortened: only the model's context (Sequence.ctx_keep, ctx_dropped) is.
Without a shift a full context finishes the request with "length", as before; with it, a
request without max_tokens runs until a stop token or string.
"""

from __future__ import annotations

import logging

import numpy as np

from edge_infer.engine.model_runner import ModelRunner
from edge_infer.engine.scheduler import Scheduler
from edge_infer.engine.sequence import Sequence

log = logging.getLogger("edge_infer.engine")


class ContextShift:
    def __init__(self, keep: int | None, bos: int, max_model_len: int, scheduler: Scheduler,
                 runner: ModelRunner) -> None:
        """keep: the tokens after BOS always kept (None: a chat's first message); bos: 1 where
        the model's prompts start with BOS, else 0."""
        self.keep, self.bos = keep, bos
        self.max_model_len, self.scheduler, self.runner = max_model_len, scheduler, runner
        self.shifts = 0

    def span(self, seq: Sequence) -> tuple[int, int]:
        """(n_keep, n_discard) of seq's next shift (n_discard 0: nothing can go)."""
        starts = seq.message_starts if self.keep is None else ()
        keep = self.bos + (self.keep or 0) if not starts else starts[0]
        n_keep = seq.ctx_keep if seq.ctx_dropped else max(0, min(self.max_model_len - 4, keep))
        n_left = seq.num_computed_tokens - n_keep
        n_discard = max(0, min(n_left // 2, n_left - 1))
        # the oldest whole messages: the start (tokens after n_keep, in the shifted context)
        # nearest the half, in the middle half
        at = [b - seq.ctx_dropped - n_keep for b in starts[1:]]
        whole = [c for c in at if n_left // 4 <= c <= 3 * n_left // 4 and 0 < c <= n_left - 1]
        return n_keep, (min(whole, key=lambda c: abs(c - n_discard)) if whole and n_discard > 0 else n_discard)

    def apply(self) -> list[Sequence]:
        """Shift every decoding sequence whose context is full; returns those it could not
        shift (the pool has no room for the moved rows, or nothing is left to drop)."""
        failed = []
        for seq in self.scheduler.running:
            if seq.num_tokens < self.max_model_len or seq.num_computed_tokens != seq.num_tokens - 1:
                continue
            if seq.images:  # image embeddings are placed by prompt position: finished as without a shift
                failed.append(seq)
                continue
            n_keep, n_discard = self.span(seq)
            moves = self.scheduler.shift_context(seq, n_keep, n_discard) if n_discard > 0 else None
            if moves is None:
                failed.append(seq)
                continue
            self.runner.shift_kv(np.asarray(moves, np.int64).reshape(-1, 3))
            seq.ctx_keep = n_keep
            seq.ctx_dropped += n_discard
            self.shifts += 1
            log.info("context shift of request %s: kept %d, dropped %d", seq.request_id, n_keep, n_discard)
        return failed
