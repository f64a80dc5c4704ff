"""WordPiece (GGUF `tokenizer.ggml.model == "bert"`), as llama.cpp's llm_tokenizer_wpm_session runs it.

The GGUF vocabulary is already converted to llama.cpp's "phantom space" form: a word-initial
piece is stored as "▁piece", a continuation ("##piece" in the HF vocab) as "piece", special
tokens ("[CLS]") unchanged. Per text fragment llama.cpp then:

1. with strip_accents, replaces each code point by the *first* code point of its NFD form
   (a one-to-one map: "é" -> "e", a Hangul syllable -> its leading jamo only);
2. splits on whitespace and drops NUL, U+FFFD, Unicode C* (control, format, private use,
   surrogate) and, with strip_accents, every M* mark; lower-cases (simple one-code-point
   mapping) when asked;
3. makes each punctuation character, each ASCII symbol and each CJK ideograph a word of its own;
4. for each word, takes the longest vocabulary match of "▁" + word from the left, then the
   longest match from where it ended, and so on; if some position has no match the whole
   word becomes one [UNK]. Unlike HF's WordPiece there is no 100-character word limit.

The character classes, NFD and lower-case maps come from Python's `unicodedata`, as llama.cpp's
tables were generated (scripts/gen-unicode-data.py), plus the 72 Unicode 15.0 code points that
Python 3.11 does not know. Code points newer than llama.cpp's Unicode 15 count as unassigned
in both; a Python with a newer Unicode could classify them where llama.cpp does not.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from edge_infer.errors import TokenizerError

__all__ = ["WPMModel", "wpm_words"]

SPACE = "\u2581"
_CACHE_LIMIT = 1 << 17

# Unicode White_Space (PropList.txt), the set llama.cpp's is_whitespace flag holds.
_WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029]
    + [0x202F, 0x205F, 0x3000]
)
# llm_tokenizer_wpm_session::is_chinese_char (0x2B920 as in HF's Rust code; the block starts at 0x2B820).
_CJK = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
_DROPPED_CATEGORIES = ("Cc", "Cf", "Co", "Cs")  # llama.cpp's \p{C} flag; Cn is "undefined", kept
# The code points whose class llama.cpp's table (Unicode 15) has and Python 3.11's unicodedata
# (Unicode 14) leaves unassigned, found by comparing the two tables; read only for "Cn".
_UNICODE_15 = {
    **dict.fromkeys([0xCF3, 0xECE, *range(0x10EFD, 0x10F00), 0x11241, 0x11F00, 0x11F01, 0x11F03], "Mn"),
    **dict.fromkeys([*range(0x11F34, 0x11F3B), *range(0x11F3E, 0x11F43), 0x13440, *range(0x13447, 0x13456)], "Mn"),
    **dict.fromkeys([0x1E08F, *range(0x1E4EC, 0x1E4F0)], "Mn"),
    **dict.fromkeys(range(0x13439, 0x13440), "Cf"),
    **dict.fromkeys([*range(0x11B00, 0x11B0A), *range(0x11F43, 0x11F50)], "Po"),
}


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _lower(c: str) -> str:
    # UnicodeData's simple lowercase: one code point. str.lower() is the full mapping, which
    # differs only for U+0130 ("i" + U+0307); its first code point is the simple mapping.
    low = c.lower()
    return low if len(low) == 1 else low[0]


class _Normalizer(dict):
    """str.translate table filled on demand: each code point -> its text in the word stream.

    " " separates words (whitespace, and around an isolated character); "" drops the code point.
    """

    def __init__(self, lowercase: bool, strip_accents: bool) -> None:
        super().__init__()
        self._lowercase = lowercase
        self._strip = strip_accents

    def __missing__(self, cp: int) -> str:
        c = chr(cp)
        if self._strip:
            c = unicodedata.normalize("NFD", c)[0]
        q = ord(c)
        cat = unicodedata.category(c)
        if cat == "Cn":
            cat = _UNICODE_15.get(q, cat)
        if q in _WHITESPACE:
            rep = " "
        elif q in (0, 0xFFFD) or cat in _DROPPED_CATEGORIES or (self._strip and cat[0] == "M"):
            rep = ""
        else:
            s = _lower(c) if self._lowercase else c
            # the flags are those of the code point before lower-casing
            alone = cat[0] == "P" or (q < 0x7F and cat[0] == "S") or _is_cjk(q)
            rep = f" {s} " if alone else s
        self[cp] = rep
        return rep


_NORMALIZERS: dict[tuple[bool, bool], _Normalizer] = {}


def wpm_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: the text's words, normalised and split."""
    key = (lowercase, strip_accents)
    table = _NORMALIZERS.get(key)
    if table is None:
        table = _NORMALIZERS[key] = _Normalizer(lowercase, strip_accents)
    return [w for w in text.translate(table).split(" ") if w]


class WPMModel:
    """Text fragment -> token ids for one WordPiece vocabulary in llama.cpp's phantom-space form."""

    def __init__(self, token_to_id: dict[str, int], unk_id: int | None, lowercase: bool = True,
                 strip_accents: bool = True) -> None:
        # llama.cpp matches UTF-8 substrings at byte offsets, bounded by the longest token's bytes.
        self._tid = {t.encode("utf-8", "surrogateescape"): i for t, i in token_to_id.items()}
        self._max_len = max(map(len, self._tid), default=0)
        self._unk = unk_id
        self._lowercase = lowercase
        self._strip = strip_accents
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode_fragments(self, frags: Sequence[str | int]) -> list[int]:
        """Ids of text fragments (str) and special tokens already found in the text (int)."""
        out: list[int] = []
        for f in frags:
            if isinstance(f, str):
                self.encode(f, out)
            else:
                out.append(f)
        return out

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of one raw text fragment (no special-token text left in it) to `out`."""
        cache = self._cache
        for word in wpm_words(text, self._lowercase, self._strip):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)

    def _encode_word(self, word: str) -> tuple[int, ...]:
        tid, max_len = self._tid, self._max_len
        w = (SPACE + word).encode("utf-8", "surrogateescape")
        n = len(w)
        ids: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + max_len + 1), i, -1):
                t = tid.get(w[i:j])
                if t is not None:
                    ids.append(t)
                    i = j
                    break
            else:  # no piece starts here: the whole word is unknown
                return (self._unknown(word),)
        return tuple(ids)

    def _unknown(self, word: str) -> int:
        if self._unk is None:
            # llama.cpp would emit the null token (-1) here
            raise TokenizerError(
                f"the word {word[:40]!r} has no WordPiece tokens and the vocabulary has no unknown "
                "token (tokenizer.ggml.unknown_token_id)"
            )
        return self._unk
