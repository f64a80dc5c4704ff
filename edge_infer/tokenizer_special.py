"""Split text around special tokens the way llama.cpp's tokenizer_st_partition does.

llama.cpp takes the special tokens longest first; for each, it scans every text fragment
left to right, cutting out each non-overlapping occurrence. So a longer token wins over a
shorter one that starts earlier, which leftmost-longest regex matching would not give.
We reproduce that exactly without rescanning the text once per special token: one regex
(a trie of all the token texts) finds every position where some special token starts and
the longest one there; shorter ones there are its prefixes. Then the tokens that occur are
taken in llama.cpp's order, each accepting its occurrences left to right unless they touch
text already taken (a byte mask over the text).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

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
        # `specials` is (text, id) in llama.cpp's order: longest text first.
        self._order = {text: k for k, (text, _) in enumerate(specials)}
        self._ids = dict(specials)
        self._lstrip = lstrip
        self._rstrip = rstrip
        self._regex: re.Pattern[str] | None = None
        self._prefixes: dict[str, list[str]] = {}

    def __bool__(self) -> bool:
        return bool(self._ids)

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
        occurrences: dict[str, list[int]] = {}
        for m in self._regex.finditer(text):
            pos = m.start()
            for tok in self._special_prefixes(m.group(1)):
                occurrences.setdefault(tok, []).append(pos)
        if not occurrences:
            return [text]
        # mask: 0 = free text, 1 = taken by a special token, 2 = stripped whitespace.
        mask = bytearray(len(text))
        taken: list[tuple[int, int, int]] = []  # (start, end, id)
        for tok in sorted(occurrences, key=self._order.__getitem__):
            n, tid = len(tok), self._ids[tok]
            next_free = 0
            for pos in occurrences[tok]:
                if pos < next_free or mask.count(0, pos, pos + n) != n:
                    continue
                mask[pos : pos + n] = b"\x01" * n
                taken.append((pos, pos + n, tid))
                next_free = pos + n
                if tid in self._lstrip:
                    _strip(text, mask, pos - 1, -1)
                if tid in self._rstrip:
                    next_free = _strip(text, mask, pos + n, 1)
        taken.sort()
        out: list[str | int] = []
        pos = 0
        for start, end, tid in taken:
            if start > pos:
                _append_free(out, text, mask, pos, start)
            out.append(tid)
            pos = end
        if pos < len(text):
            _append_free(out, text, mask, pos, len(text))
        return out


def _strip(text: str, mask: bytearray, pos: int, step: int) -> int:
    # Mark the whitespace next to a special token (inside the same free fragment) as gone.
    while 0 <= pos < len(text) and mask[pos] == 0 and text[pos] in _C_SPACE:
        mask[pos] = 2
        pos += step
    return pos


def _append_free(out: list[str | int], text: str, mask: bytearray, start: int, end: int) -> None:
    # Text between two special tokens, minus stripped whitespace (only ever at its ends).
    while start < end and mask[start] == 2:
        start += 1
    while end > start and mask[end - 1] == 2:
        end -= 1
    if start < end:
        out.append(text[start:end])
