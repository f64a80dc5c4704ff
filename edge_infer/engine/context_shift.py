"""Context shift (`context_shift=True`, `--context-shift`), llama.cpp's: when a generating
sequence's context is full, keep its first tokens, drop half of the rest, and go on.

The rule is llama.cpp server's, so that the tokens after a shift are the ones llama.cpp gives:
when the context holds max_model_len - 1 computed tokens and the next one is waiting, n_keep =
context_keep (llama.cpp's --keep, default 0) + 1 for the model's BOS, at most max_model_len - 4;
the n_discard = (computed - n_keep) / 2 tokens after the first n_keep are dropped and the later
ones move down n_discard positions: their K/V are kept as computed (not recomputed), the keys
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
    def __init__(self, keep: int, max_model_len: int, scheduler: Scheduler, runner: ModelRunner) -> None:
        """keep: the tokens always kept (BOS included)."""
        self.n_keep = max(0, min(max_model_len - 4, keep))
        self.max_model_len, self.scheduler, self.runner = max_model_len, scheduler, runner
        self.shifts = 0

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
            n_left = seq.num_computed_tokens - self.n_keep
            n_discard = max(0, min(n_left // 2, n_left - 1))
            moves = self.scheduler.shift_context(seq, self.n_keep, n_discard) if n_discard > 0 else None
            if moves is None:
                failed.append(seq)
                continue
            self.runner.shift_kv(np.asarray(moves, np.int64).reshape(-1, 3))
            seq.ctx_keep = self.n_keep
            seq.ctx_dropped += n_discard
            self.shifts += 1
            log.debug("context shift of request %s: kept %d, dropped %d", seq.request_id, self.n_keep, n_discard)
        return failed
