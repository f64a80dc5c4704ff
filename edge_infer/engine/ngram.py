"""Prompt-lookup proposer: find the latest earlier occurrence of a sequence's last n tokens
(n = n_max down to 1) in its prompt and output so far, and propose what followed it."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_infer.engine.sequence import Sequence
from edge_infer.engine.spec_decode import Proposal


@dataclass(slots=True)
class NgramIndex:
    """index[gram] = start of the gram's latest occurrence that has a continuation (it ends
    before the last token), built incrementally over the first indexed_upto tokens."""

    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed_upto: int = 0


class NgramProposer:
    """A Proposer with no model: proposals are deterministic (no draft distributions)."""

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max
        self.indexes: dict[int, NgramIndex] = {}

    def _update_index(self, tokens: list[int], st: NgramIndex) -> None:
        # only grams that end before the last token, so a lookup never matches the suffix itself
        idx = st.index
        for end in range(max(st.indexed_upto, 1), len(tokens)):
            for n in range(1, self.n_max + 1):
                if end - n >= 0:
                    idx[tuple(tokens[end - n : end])] = end - n
        st.indexed_upto = len(tokens)

    def lookup(self, seq: Sequence, k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier match of seq's last tokens."""
        st = self.indexes.setdefault(seq.seq_id, NgramIndex())
        tokens = seq.all_token_ids()
        self._update_index(tokens, st)
        for n in range(min(self.n_max, len(tokens) - 1), 0, -1):
            start = st.index.get(tuple(tokens[-n:]))
            if start is not None:
                return tokens[start + n : start + n + k]
        return []

    def propose(self, wanted: list[tuple[Sequence, int]]) -> dict[int, Proposal]:
        out: dict[int, Proposal] = {}
        for seq, k in wanted:
            toks = self.lookup(seq, k)
            out[seq.seq_id] = (toks, [None] * len(toks))
        return out

    def rollback(self, seq: Sequence) -> None:
        """Nothing to undo: the index holds only tokens the target has accepted."""

    def release(self, seq: Sequence) -> None:
        self.indexes.pop(seq.seq_id, None)
