"""Streaming detokenizer: token ids in, newly completed text out, as the sequence grows.

The concatenation of everything `add` and `flush` return equals `Tokenizer.decode` of the
whole sequence, but each call costs only the new token's bytes. A character whose UTF-8
bytes are split over several tokens is held back until it is complete, so the output never
contains half a character. The leading space SentencePiece puts in front of the text is
removed from the first token when the vocabulary adds one (llama.cpp's remove_space).

Vocabularies with clean_spaces (llama.cpp's clean_up_tokenization_spaces) also hold back
the bytes whose cleaning depends on what comes next: the cleaning rules only look one or
two bytes around a space or an apostrophe, so any point after two bytes that are neither
is a place where cleaning the parts apart gives the same as cleaning them together.
"""

from __future__ import annotations

import codecs
from typing import Protocol

__all__ = ["IncrementalDetokenizer", "PieceSource", "clean_spaces"]

_HOLD = b" '"  # bytes the cleaning rules react to


class PieceSource(Protocol):
    """What the detokenizer needs of a tokenizer (`Tokenizer` is one)."""

    @property
    def add_space_prefix(self) -> bool: ...

    @property
    def clean_spaces(self) -> bool: ...

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes: ...


class IncrementalDetokenizer:
    """Decodes one sequence token by token; use one instance per sequence."""

    __slots__ = ("_piece", "_special", "_first", "_strip_first", "_utf8", "_clean", "_pending")

    def __init__(self, tokenizer: PieceSource, skip_special: bool = False) -> None:
        self._piece = tokenizer.token_to_piece
        self._special = not skip_special
        self._first = True
        self._strip_first = tokenizer.add_space_prefix
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._clean = tokenizer.clean_spaces
        self._pending = bytearray()  # raw bytes not yet cleaned (clean_spaces only)

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text it completes (often "", never half a character)."""
        data = self._piece(token_id, self._special)
        if self._first:
            self._first = False
            if self._strip_first and data[:1] == b" ":
                data = data[1:]
        if not self._clean:
            return self._utf8.decode(data) if data else ""
        pending = self._pending
        pending += data
        # Cut after the last byte that, with the one before it, is no space or apostrophe.
        k = len(pending)
        while k > 1 and (pending[k - 1] in _HOLD or pending[k - 2] in _HOLD):
            k -= 1
        if k == 1 and pending[0] in _HOLD:
            k = 0  # the byte before `pending` is always safe (it ended an earlier cut)
        if k == 0:
            return ""
        ready = clean_spaces(bytes(pending[:k]))
        del pending[:k]
        return self._utf8.decode(ready)

    def add_many(self, token_ids: list[int]) -> str:
        """Feed several tokens at once; returns the text they complete."""
        return "".join([self.add(t) for t in token_ids])

    def flush(self) -> str:
        """End of sequence: the text still held back (an unfinished character becomes U+FFFD)."""
        rest = b""
        if self._pending:
            rest = clean_spaces(bytes(self._pending))
            self._pending.clear()
        return self._utf8.decode(rest, final=True)


def clean_spaces(data: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: " ." -> ".", " ' " -> "'", " 's" -> "'s" etc."""
    if b" " not in data:
        return data
    t = bytearray(data)
    # pass 1: drop a space before ? ! . ,
    out = bytearray(t[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    # pass 2: " ' " -> "'" (the space after is blanked so it cannot start another match)
    t, out = out, bytearray(out[:1])
    i = 1
    while i < len(t):
        x = t[i]
        if x == 0x27 and i + 1 < len(t) and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            out.pop()
            t[i + 1] = 0
            i += 1
        out.append(x)
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    t, out = out, bytearray(out[:1])
    for i in range(1, len(t)):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < len(t):
            x1 = t[i + 1]
            if x1 in b"sm" or (i + 2 < len(t) and (t[i + 1 : i + 3] in (b"re", b"ve"))):
                out.pop()
        out.append(x)
    return bytes(out)
