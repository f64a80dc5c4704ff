"""BPE (GGUF `tokenizer.ggml.model` "gpt2" or "gemma4"): merges by rank, as llama.cpp runs them.

A word from the pre-tokenizer is first byte-encoded (GPT-2's printable stand-in for each
UTF-8 byte), then its characters are merged pairwise, always the pair with the lowest
merge rank first and, among equal ranks, the leftmost. llama.cpp does not require the
merged text to be a token; a final piece that is not one falls back to single-byte tokens.
Words repeat a lot in real text, so results are cached per word.

SentencePiece-style vocabularies (gemma4) skip the byte encoding: spaces become U+2581,
merges run on the raw characters and the byte fallback uses <0xXX> tokens.
"""

from __future__ import annotations

import heapq
from itertools import chain
from typing import cast

from edge_infer.tokenizer.pretok import PreTokenizer

__all__ = ["BYTE_DECODER", "BYTE_ENCODER", "BPEModel", "byte_encode"]


def _byte_chars() -> list[str]:
    # Printable Latin-1 bytes stand for themselves; the others get code points from 256 on.
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table: dict[int, int] = {b: b for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + n
            n += 1
    return [chr(table[b]) for b in range(256)]


BYTE_ENCODER: list[str] = _byte_chars()  # byte value -> stand-in character
BYTE_DECODER: dict[str, int] = {c: b for b, c in enumerate(BYTE_ENCODER)}
_ENCODE_TABLE = {b: c for b, c in enumerate(BYTE_ENCODER)}

_CACHE_LIMIT = 1 << 17


def byte_encode(word: str) -> str:
    """GPT-2 byte-level form of `word`: one stand-in character per UTF-8 byte."""
    if word.isascii() and word.isprintable() and " " not in word:
        return word  # printable ASCII but space maps to itself
    return word.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)


class BPEModel:
    """Text fragment -> token ids for one byte-level BPE vocabulary."""

    def __init__(
        self,
        token_to_id: dict[str, int],
        merges: list[str],
        pre_tokenizer: PreTokenizer,
        *,
        ignore_merges: bool = False,
        escape_whitespace: bool = False,
        whole_newlines: bool = False,
    ) -> None:
        self._tid = token_to_id
        # llama.cpp keeps the first rank of a repeated merge; keys stay "left right" strings
        # (byte-level pieces hold no spaces), which makes loading a plain dict build.
        self._ranks = dict(zip(reversed(merges), range(len(merges) - 1, -1, -1), strict=True))
        self._pre = pre_tokenizer
        self._ignore_merges = ignore_merges
        self._escape = escape_whitespace  # also: no byte encoding, <0xXX> byte fallback
        self._whole_newlines = whole_newlines
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of a text fragment (no special tokens in it) to `out`."""
        if self._escape:
            text = text.replace(" ", "\u2581")
        words = self._pre.split(text)
        cache = self._cache
        found = list(map(cache.get, words))  # most words were seen before
        for k in [k for k, ids in enumerate(found) if ids is None]:
            word = words[k]
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word if self._escape else byte_encode(word))
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            found[k] = ids
        out.extend(chain.from_iterable(cast("list[tuple[int, ...]]", found)))  # no None left

    def _encode_word(self, word: str) -> tuple[int, ...]:
        tid = self._tid
        if (self._ignore_merges or (self._whole_newlines and not word.strip("\n"))) and word in tid:
            return (tid[word],)
        pieces = self._merge(word)
        out: list[int] = []
        for piece in pieces:
            i = tid.get(piece)
            if i is not None:
                out.append(i)
                continue
            # Not a token: llama.cpp looks up each byte of the piece's UTF-8 form alone and
            # drops the bytes that are no token (a lone byte >= 0x80 is stored escaped).
            for b in piece.encode("utf-8"):
                if self._escape:
                    j = tid.get(f"<0x{b:02X}>")
                else:
                    j = tid.get(chr(b) if b < 0x80 else bytes([b]).decode("utf-8", "surrogateescape"))
                if j is not None:
                    out.append(j)
        return tuple(out)

    def _merge(self, word: str) -> list[str]:
        # Symbol i always starts at character i (a merge keeps the left start), so a symbol
        # is (start, size) and a queued pair is (rank, left, size of both): it is stale once
        # either side has changed, which shows as a dead left or a different total size.
        n = len(word)
        if n < 2:
            return [word] if word else []
        rank_of = self._ranks.get
        heap: list[tuple[int, int, int]] = []
        for i in range(n - 1):
            r = rank_of(word[i] + " " + word[i + 1])
            if r is not None:
                heap.append((r, i, 2))
        if not heap:
            return list(word)
        size = [1] * n
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, total = pop(heap)
            ls = size[left]
            right = nxt[left]
            if not ls or right < 0 or ls + size[right] != total:
                continue
            size[left] = total
            size[right] = 0
            nx = nxt[right]
            nxt[left] = nx
            merged = word[left : left + total]
            if nx >= 0:
                prv[nx] = left
                sn = size[nx]
                r = rank_of(merged + " " + word[nx : nx + sn])
                if r is not None:
                    push(heap, (r, left, total + sn))
            pv = prv[left]
            if pv >= 0:
                r = rank_of(word[pv:left] + " " + merged)
                if r is not None:
                    push(heap, (r, pv, left - pv + total))
        out = []
        i = 0
        while i >= 0:
            out.append(word[i : i + size[i]])
            i = nxt[i]
        return out
