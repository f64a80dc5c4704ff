"""Draft-model proposer for speculative decoding: a second (smaller or lower-precision) model
with the same vocabulary, run through the same runtime with its own paged KV cache.

Each target sequence has a shadow sequence in the draft's block manager. Proposing k tokens
costs one catch-up forward (the tokens the draft has not seen yet, batched over sequences)
plus k - 1 one-token forwards; after verification the shadow rolls back to the accepted prefix.
"""

from __future__ import annotations

import numpy as np

from edge_infer.config import EngineConfig
from edge_infer.engine.loader import load_model
from edge_infer.engine.sampler import draw, process_logits, sampling_probs
from edge_infer.engine.scheduler import ScheduledChunk
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.spec_decode import Proposal
from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.tokenizer import Tokenizer


class DraftProposer:
    """A Proposer backed by a second model (its own runner, block manager and KV pool)."""

    def __init__(self, model: str, target_tokenizer: Tokenizer, n_threads: int, kv_cache_memory: int) -> None:
        cfg = EngineConfig(model=model, n_threads=n_threads, kv_cache_memory=kv_cache_memory,
                           enable_prefix_caching=False)
        m = load_model(cfg)
        if m.model_config.recurrent:
            raise UnsupportedModelError(f"speculative draft model {model}: {m.model_config.arch} has recurrent layers, "
                                        "whose state cannot be rolled back to the accepted tokens yet")
        self.prefill, self.tokenizer = m.prefill, m.tokenizer  # the shadows' only way into the blocks
        _check_same_vocab(target_tokenizer, m.tokenizer, model)
        self.shadows: dict[int, Sequence] = {}

    def _shadow(self, seq: Sequence) -> Sequence:
        sh = self.shadows.get(seq.seq_id)
        if sh is None:
            sh = Sequence(f"draft-{seq.request_id}", [], seq.params)
            self.shadows[seq.seq_id] = sh
        return sh

    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, Proposal]:
        """k proposals (and the draft's distributions, None when greedy) per sequence id."""
        active: list[tuple[Sequence, Sequence, int]] = []
        chunks: list[ScheduledChunk] = []
        for seq, k in wanted:
            sh = self._shadow(seq)
            n = seq.num_tokens - sh.num_computed_tokens
            if k <= 0 or n <= 0 or not self.prefill.reserve(sh, n + k - 1):
                continue
            toks = seq.tokens_slice(sh.num_computed_tokens, seq.num_tokens)
            chunks.append(ScheduledChunk(sh, toks, [len(toks) - 1]))
            active.append((seq, sh, k))
        out: dict[int, Proposal] = {s.seq_id: ([], []) for s, _, _ in active}
        if not active:
            return out
        rows = self.prefill.forward(chunks)
        while True:
            nxt = []
            for i, (seq, sh, k) in enumerate(active):
                toks, probs = out[seq.seq_id]
                if len(toks) >= k:
                    continue
                tok, q = self._pick(rows[i], seq, toks)
                toks.append(tok)
                probs.append(q)
                if len(toks) < k:
                    nxt.append((seq, sh, k, tok))
            if not nxt:
                return out
            rows = self.prefill.forward([ScheduledChunk(sh, [tok], [0]) for _, sh, _, tok in nxt])
            active = [(seq, sh, k) for seq, sh, k, _ in nxt]

    def _pick(self, logits: np.ndarray, seq: Sequence, proposed: list[int]) -> tuple[int, np.ndarray | None]:
        x = process_logits(logits, seq, proposed)  # penalties see the proposals before this one
        if seq.params.greedy:
            return int(np.argmax(x)), None
        q = sampling_probs(x, seq.params)
        assert seq.rng is not None
        return draw(q, seq.rng), q

    def rollback(self, seq: Sequence) -> None:
        """Keep only the draft KV of tokens the target has confirmed (all but its last token)."""
        sh = self.shadows.get(seq.seq_id)
        if sh is None:
            return
        self.prefill.rollback(sh, seq.num_tokens - 1)

    def release(self, seq: Sequence) -> None:
        sh = self.shadows.pop(seq.seq_id, None)
        if sh is not None:
            self.prefill.release(sh)


def _check_same_vocab(target: Tokenizer, draft: Tokenizer, model: str) -> None:
    if target.vocab_size != draft.vocab_size:
        raise InvalidRequest(
            f"draft model {model!r} has a vocabulary of {draft.vocab_size} tokens, the target has "
            f"{target.vocab_size}: speculative decoding needs the same vocabulary"
        )
    for i in range(target.vocab_size):
        if target.token_text(i) != draft.token_text(i):
            raise InvalidRequest(
                f"draft model {model!r} differs from the target at token {i} "
                f"({draft.token_text(i)!r} vs {target.token_text(i)!r}): the vocabularies must be identical"
            )
