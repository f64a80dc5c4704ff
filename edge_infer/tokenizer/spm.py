"""SentencePiece-style BPE (GGUF `tokenizer.ggml.model == "llama"`), as llama.cpp runs it.

Spaces become U+2581 ("▁"), optionally with one prepended (`add_space_prefix`). The text
starts as one symbol per character; the adjacent pair whose concatenation is a token with
the highest score merges first (ties: leftmost), until no pair is a token. A final symbol
that is no token is emitted as byte tokens `<0xNN>` (byte fallback).

Speed: merges can only join characters that sit next to each other inside some token, so
the text is cut before every "▁" whose left neighbour never precedes "▁" inside a token;
the pieces tokenize independently (no token spans a cut) and are cached like BPE words.
"""

from __future__ import annotations

import heapq
import re
from itertools import chain
from typing import cast

from edge_infer.errors import TokenizerError

__all__ = ["SPMModel"]

SPACE = "\u2581"
_CACHE_LIMIT = 1 << 17


class SPMModel:
    """Text fragment -> token ids for one SentencePiece vocabulary (scores + byte tokens)."""

    def __init__(self, token_to_id: dict[str, int], scores: list[float]) -> None:
        self._tid = token_to_id
        self._scores = scores
        self._byte_ids: list[int] | None = None
        self._splitter: re.Pattern[str] | None = None
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of an already space-escaped fragment to `out`."""
        if self._splitter is None:
            self._splitter = self._build_splitter()
        pieces = self._splitter.split(text)
        cache = self._cache
        found = list(map(cache.get, pieces))  # most pieces were seen before
        for k in [k for k, ids in enumerate(found) if ids is None]:
            piece = pieces[k]
            ids = cache.get(piece)
            if ids is None:
                ids = self._encode_piece(piece) if piece else ()
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[piece] = ids
            found[k] = ids
        out.extend(chain.from_iterable(cast("list[tuple[int, ...]]", found)))  # no None left

    def _build_splitter(self) -> re.Pattern[str]:
        # Characters that some token has right before a "▁": no cut after them. Built on the
        # first encode, not at load (it scans the whole vocabulary).
        glued: set[str] = set()
        for t in self._tid:
            i = t.find(SPACE, 1)
            while i > 0:
                glued.add(t[i - 1])
                i = t.find(SPACE, i + 1)
        if not glued:
            return re.compile(f"(?={SPACE})")
        cls = "".join(sorted(re.escape(c) for c in glued))
        return re.compile(f"(?<![{cls}])(?={SPACE})")

    def _byte_token(self, b: int) -> int:
        if self._byte_ids is None:
            tid = self._tid
            ids = []
            for v in range(256):
                i = tid.get(f"<0x{v:02X}>")
                if i is None:  # llama.cpp falls back to the byte as a one-character token
                    i = tid.get(chr(v) if v < 0x80 else bytes([v]).decode("utf-8", "surrogateescape"), -1)
                ids.append(i)
            self._byte_ids = ids
        i = self._byte_ids[b]
        if i < 0:
            raise TokenizerError(f"SPM vocabulary has no byte token <0x{b:02X}> for byte fallback")
        return i

    def _encode_piece(self, text: str) -> tuple[int, ...]:
        tid, scores = self._tid, self._scores
        n = len(text)
        # Symbol i always starts at character i (merges keep the left start); size[i] == 0
        # once it has been merged into its left neighbour. A queued pair is (-score, left,
        # size of both): stale once either side changed (dead left or another total).
        size = [1] * n
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int]] = []
        for i in range(n - 1):
            t = tid.get(text[i : i + 2])
            if t is not None:
                heap.append((-scores[t], i, 2))
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
            if nx >= 0:
                prv[nx] = left
                sn = size[nx]
                t = tid.get(text[left : nx + sn])
                if t is not None:
                    push(heap, (-scores[t], left, total + sn))
            pv = prv[left]
            if pv >= 0:
                t = tid.get(text[pv : left + total])
                if t is not None:
                    push(heap, (-scores[t], pv, left - pv + total))
        out: list[int] = []
        i = 0
        while i >= 0:
            piece = text[i : i + size[i]]
            t = tid.get(piece)
            if t is not None:
                out.append(t)
            else:
                out.extend(self._byte_token(b) for b in piece.encode("utf-8"))
            i = nxt[i]
        return tuple(out)
