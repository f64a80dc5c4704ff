"""Split text around special tokens the way llama.cpp's tokenizer_st_partition does.

llama.cpp takes the special tokens longest first; for each, it scans every text fragment
left to right, cutting out each non-overlapping occurrence. So a longer token wins over a
shorter one that starts earlier, which leftmost-longest regex matching would not give.
We reproduce that exactly without rescanning the text once per special token: one regex
(a trie of all the token texts) finds every position where some special token starts and
the longest one there; shorter ones there are its prefixes. Then the tokens that occur are
taken in llama.cpp's order, each accepting its occurrences left to right unless they touch
text already taken (a mask over the text; when a token's free occurrences cannot overlap
each other, they are all accepted in one vectorised step).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

__all__ = ["SpecialMatcher", "trie_regex"]

_C_SPACE = " \t\n\v\f\r"  # C isspace(), which llama.cpp's lstrip/rstrip use


def trie_regex(words: Iterable[str]) -> str:
    """A regex matching any of `words`, the longest one where several match at a position."""
    trie: dict[str, dict] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, dict]) -> str:
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        # Greedy optional: the longer continuation is tried before stopping here.
        return f"(?:{body})?" if "" in node else body

    return build(trie)


class SpecialMatcher:
    """Cuts text into raw fragments (str) and special token ids (int)."""

    __slots__ = ("_order", "_ids", "_lstrip", "_rstrip", "_regex", "_prefixes")

    def __init__(self, specials: list[tuple[str, int]], lstrip: set[int], rstrip: set[int]) -> None:
        # `specials` is (text, id) in llama.cpp's order: longest text first. Of two tokens
        # with the same text the first one in that order takes every occurrence.
        self._order: dict[str, int] = {}
        self._ids: dict[str, int] = {}
        for k, (text, tid) in enumerate(specials):
            self._order.setdefault(text, k)
            self._ids.setdefault(text, tid)
        self._lstrip = lstrip
        self._rstrip = rstrip
        self._regex: re.Pattern[str] | None = None
        self._prefixes: dict[str, list[str]] = {}

    def _special_prefixes(self, longest: str) -> list[str]:
        got = self._prefixes.get(longest)
        if got is None:
            ids = self._ids
            got = [longest[:k] for k in range(1, len(longest) + 1) if longest[:k] in ids]
            self._prefixes[longest] = got
        return got

    def partition(self, text: str) -> list[str | int]:
        """Fragments of `text` in order: str for text, int for a special token."""
        if not self._ids or not text:
            return [text] if text else []
        if self._regex is None:
            self._regex = re.compile(f"(?=({trie_regex(self._ids)}))", re.DOTALL)
        starts: dict[str, list[int]] = {}  # longest special token at a position -> positions
        for m in self._regex.finditer(text):
            starts.setdefault(m.group(1), []).append(m.start())
        if not starts:
            return [text]
        occurrences: dict[str, list[list[int]]] = {}
        for longest, positions in starts.items():
            for tok in self._special_prefixes(longest):
                occurrences.setdefault(tok, []).append(positions)
        # Few occurrences: check them one by one. Many (whitespace-run tokens in indented
        # code): filter the ones in free text with array operations first.
        vectorise = sum(map(len, starts.values())) > 2048
        # mask: 0 = free text, 1 = taken by a special token, 2 = stripped whitespace.
        mask = np.zeros(len(text), dtype=np.int8)
        found: list[tuple[list[int], int, int]] = []  # (starts, id, length)
        for tok in sorted(occurrences, key=self._order.__getitem__):
            n, tid = len(tok), self._ids[tok]
            lists = occurrences[tok]
            if not vectorise:
                positions = lists[0] if len(lists) == 1 else sorted(p for ps in lists for p in ps)
                taken = self._take_in_order(text, mask, positions, n, tid, check=True)
            else:
                cand = np.sort(np.concatenate([np.asarray(ps, dtype=np.int64) for ps in lists]))
                free = np.ones(len(cand), dtype=bool)
                for k in range(n):  # every occurrence lies inside the text
                    free &= mask[cand + k] == 0
                cand = cand[free]
                overlapping = n > 1 and bool((np.diff(cand) < n).any())
                if overlapping or tid in self._lstrip or tid in self._rstrip:
                    taken = self._take_in_order(text, mask, cand.tolist(), n, tid, check=False)
                else:  # no two can overlap: all are taken, as the scan would take them
                    mask[(cand[:, None] + np.arange(n)).ravel()] = 1
                    taken = cand.tolist()
            if taken:
                found.append((taken, tid, n))
        spans = sorted((p, tid, n) for taken, tid, n in found for p in taken)
        out: list[str | int] = []
        pos = 0
        for start, tid, n in spans:
            if start > pos:
                _append_free(out, text, mask, pos, start)
            out.append(tid)
            pos = start + n
        if pos < len(text):
            _append_free(out, text, mask, pos, len(text))
        return out

    def _take_in_order(
        self, text: str, mask: np.ndarray, positions: list[int], n: int, tid: int, check: bool
    ) -> list[int]:
        # llama.cpp's scan for one token: leftmost occurrence in free text, then search on
        # after it (and after the whitespace it strips on its right).
        taken = []
        next_free = 0
        for pos in positions:
            if pos < next_free or (check and mask[pos : pos + n].any()):
                continue
            mask[pos : pos + n] = 1
            taken.append(pos)
            next_free = pos + n
            if tid in self._lstrip:
                _strip(text, mask, pos - 1, -1)
            if tid in self._rstrip:
                next_free = _strip(text, mask, pos + n, 1)
        return taken


def _strip(text: str, mask: np.ndarray, pos: int, step: int) -> int:
    # Mark the whitespace next to a special token (inside the same free fragment) as gone.
    while 0 <= pos < len(text) and mask[pos] == 0 and text[pos] in _C_SPACE:
        mask[pos] = 2
        pos += step
    return pos


def _append_free(out: list[str | int], text: str, mask: np.ndarray, start: int, end: int) -> None:
    # Text between two special tokens, minus stripped whitespace (only ever at its ends).
    while start < end and mask[start] == 2:
        start += 1
    while end > start and mask[end - 1] == 2:
        end -= 1
    if start < end:
        out.append(text[start:end])
