"""BPE pre-tokenizers: split text into words exactly as llama.cpp does.

llama.cpp does not run the tokenizer.json regexes through a Unicode regex engine. It has
hand-written splitters for the common ones (gpt2, llama3, qwen2) and runs the rest with
std::regex over a "collapsed" text in which every non-ASCII code point is replaced by one
byte standing for its class (letter, number, punctuation, mark, symbol, whitespace, other).
Both see Unicode only through those classes, so we do the same: `collapse()` maps each
non-ASCII character to a stand-in character of its class (the mapping is 1:1 in length),
ASCII-only regexes split the collapsed text, and the spans cut the original text.

The classes come from Python's `unicodedata` (letter = L*, number = N*, ... as llama.cpp's
generated table does) plus the Unicode White_Space set. They agree with llama.cpp's table
for every code point Python knows; code points newer than Python's Unicode version are
"unassigned" here and may split differently.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from itertools import accumulate

__all__ = ["PreTokenizer", "PreTokenizerSpec", "collapse", "pre_tokenizer_spec"]

# Unicode White_Space (PropList.txt): what llama.cpp's `\s` means.
_WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029]
    + [0x202F, 0x205F, 0x3000]
)
# Stand-ins for non-ASCII code points, by class. Non-ASCII whitespace becomes \v as in
# llama.cpp (it is never \r or \n, which some regexes treat apart).
_WS_REP = 0x0B
_CLASS_REP = {"N": 0xD1, "L": 0xD2, "P": 0xD3, "M": 0xD4, "S": 0xD5}
_OTHER_REP = 0xD0  # separators that are not whitespace, controls, format, private use, unassigned


class _Collapse(dict):
    """str.translate table filled on demand: ASCII maps to itself, the rest to its class."""

    def __missing__(self, cp: int) -> int:
        if cp < 0x80:
            rep = cp
        elif cp in _WHITESPACE:
            rep = _WS_REP
        else:
            rep = _CLASS_REP.get(unicodedata.category(chr(cp))[0], _OTHER_REP)
        self[cp] = rep
        return rep


_COLLAPSE = _Collapse()


def collapse(text: str) -> str:
    """The text with each non-ASCII character replaced by its class stand-in (same length)."""
    return text if text.isascii() else text.translate(_COLLAPSE)


# Character classes over collapsed text.
_L = r"A-Za-z\xd2"
_N = r"0-9\xd1"
_WS = r"\t\n\x0b\x0c\r "
_P = r"!-#%-*,-/:;?@\[-\]_{}\xd3"  # ASCII punctuation (Unicode P*) and the stand-in
_CONTRACTIONS_CI = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

# gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_GPT2 = (
    rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_WS}{_L}{_N}]+"
    rf"|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
)


def _llama3_like(numbers: str) -> str:
    # (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|<numbers>| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    return (
        rf"{_CONTRACTIONS_CI}|[^\r\n{_L}{_N}]?[{_L}]+|{numbers}| ?[^{_WS}{_L}{_N}]+[\r\n]*"
        rf"|[{_WS}]*[\r\n]+|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
    )


_LLAMA3 = _llama3_like(rf"[{_N}]{{1,3}}")
_QWEN2 = _llama3_like(rf"[{_N}]")

# Stages run in order; each splits every span the previous ones produced. Text a regex
# does not match stays a word of its own (std::regex split semantics); the hand-written
# splitters match everything, so for them there is no such text.
_STAGES: dict[str, tuple[str, ...]] = {
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "starcoder": (rf"[{_N}]", _GPT2),
    "default": (rf"[{_P}$+<=>^~|]+", _GPT2, rf"[{_N}]+", r"[0-9][0-9][0-9]"),
    "newlines": (r"[^\n]+|\n+",),  # gemma4, sarvam-moe: lines and runs of newlines
}


@dataclass(frozen=True, slots=True)
class PreTokenizerSpec:
    """What `tokenizer.ggml.pre` implies in llama.cpp: the splitter and a few vocab flags."""

    splitter: str
    clean_spaces: bool = True  # detokenize applies clean_up_tokenization_spaces
    ignore_merges: bool = False  # a word that is a whole token skips BPE
    add_bos: bool | None = None  # default for add_bos before the GGUF key overrides it
    no_bos: bool = False  # the vocab has no BOS token
    # SentencePiece-style BPE (llama.cpp's escape_whitespaces with byte_encode false): spaces
    # become U+2581 before BPE, which runs on raw UTF-8 characters; a piece that is no token
    # falls back to <0xXX> byte tokens, and decoding turns U+2581 back into spaces.
    escape_whitespace: bool = False
    gemma4: bool = False  # a run of newlines that is a token is taken whole; BOS always added


def _names(names: str, spec: PreTokenizerSpec) -> dict[str, PreTokenizerSpec]:
    return dict.fromkeys(names.split(), spec)


# The pre-tokenizer names llama.cpp maps onto the splitters above (llama-vocab.cpp, load()).
_PRE_TYPES: dict[str, PreTokenizerSpec] = {
    **_names("default", PreTokenizerSpec("default")),
    **_names(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        PreTokenizerSpec("llama3", ignore_merges=True, add_bos=True),
    ),
    **_names("dbrx smaug-bpe", PreTokenizerSpec("llama3")),
    **_names("chatglm-bpe", PreTokenizerSpec("llama3", no_bos=True)),
    **_names("glm4 glm5", PreTokenizerSpec("llama3", ignore_merges=True, no_bos=True)),
    **_names(
        "gpt-2 gpt2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert"
        " mpt olmo jais exaone4 jina-v1-en jina-v2-code roberta-bpe",
        PreTokenizerSpec("gpt2"),
    ),
    **_names("trillion granite-docling", PreTokenizerSpec("gpt2", clean_spaces=False)),
    **_names("starcoder refact codeshell exaone minerva-7b mellum2", PreTokenizerSpec("starcoder")),
    **_names("smollm command-r", PreTokenizerSpec("starcoder", clean_spaces=False)),
    **_names(
        "qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2",
        PreTokenizerSpec("qwen2", clean_spaces=False),
    ),
    **_names("megrez stablelm2", PreTokenizerSpec("qwen2")),
    **_names("gemma4 granite-embed-multi-311m", PreTokenizerSpec("newlines", escape_whitespace=True, gemma4=True)),
    **_names("sarvam-moe", PreTokenizerSpec("newlines", clean_spaces=False, escape_whitespace=True)),
}


def pre_tokenizer_spec(name: str | None) -> PreTokenizerSpec | None:
    """The spec for a `tokenizer.ggml.pre` value (missing means "default"), None if unknown."""
    return _PRE_TYPES.get(name or "default")


class PreTokenizer:
    """Splits text into the words that BPE merges run on (no byte encoding here)."""

    __slots__ = ("_stages", "_single")

    def __init__(self, splitter: str) -> None:
        if splitter not in _STAGES:
            raise ValueError(f"unknown splitter {splitter!r}")
        self._stages = [re.compile(p) for p in _STAGES[splitter]]
        # One hand-written splitter alone matches every character: findall is enough.
        self._single = self._stages[0] if len(self._stages) == 1 else None

    def split(self, text: str) -> list[str]:
        """The words of `text`, in order; their concatenation is `text`."""
        if not text:
            return []
        c = collapse(text)
        if self._single is not None:
            parts = self._single.findall(c)
            if c is text:
                return parts
            ends = list(accumulate(map(len, parts)))
            return [text[s:e] for s, e in zip([0, *ends[:-1]], ends, strict=True)]
        spans = [(0, len(c))]
        for rx in self._stages:
            spans = _split_spans(rx, c, spans)
        return [text[s:e] for s, e in spans]


def _split_spans(rx: re.Pattern[str], c: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    # Matches and the gaps between them both become spans; `endpos` makes each span end
    # look like the end of the text to lookaheads, as llama.cpp's per-span splitting does.
    out: list[tuple[int, int]] = []
    append = out.append
    for start, end in spans:
        pos = start
        for m in rx.finditer(c, start, end):
            s, e = m.span()
            if s > pos:
                append((pos, s))
            append((s, e))
            pos = e
        if pos < end:
            append((pos, end))
    return out
