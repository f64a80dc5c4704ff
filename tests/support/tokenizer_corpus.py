"""A deterministic corpus of varied strings for comparing tokenizers with llama.cpp.

`corpus()` returns the same ~2,400 strings on every run: English prose, Python/C/JSON
source, numbers and dates, whitespace runs, many scripts (accents, combining marks, CJK,
emoji, RTL), text holding special-token strings, empty and one-character strings, a few
long documents and random mixtures of all of these.
"""

from __future__ import annotations

import json
import random
import string

__all__ = ["SPECIAL_TEXTS", "corpus", "corpus_by_kind"]

WORDS = (
    "the of and to in is was it for on with as by at from that this be are or an not have "
    "model token inference runtime memory cache kernel batch quantized attention layer weights "
    "quick brown fox jumps over lazy dog Paris London Tokyo Python llama Gemma Qwen SmolLM "
    "however therefore naïve café résumé coöperate façade jalapeño Zürich São Paulo"
).split()
CONTRACTIONS = [
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "'T",
    "'RE",
    "'Ve",
    "'M",
    "'LL",
    "'D",
    "'x",
    "'",
]
PUNCT = list(".,;:!?-—–…()[]{}\"'`/\\|@#$%^&*+=<>~_")
SPECIAL_TEXTS = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_call>", "</tool_call>", "<repo_name>",
    "<reponame>", "<file_sep>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "<start_of_turn>",
    "<end_of_turn>", "<unused0>", "<unused42>", "<start_of_image>", "[multimodal]", "</s>", "<s>",
    "<table>", "</td>", "<h1>", "<0x0A>", "<0xFF>", "[PAD151665]", "<|im_", "im_end|>", "<|", "|>",
    "<end_of_turn", "<|endoftext|", "<<|im_end|>>", "<|im_end|><|im_end|>",
]
SCRIPTS = [
    "Déjà vu à l'école, où l'on s'amuse.", "Straße, Größe, Übermaß", "Ελληνικά γράμματα και λέξεις",
    "Русский текст с ёжиком", "中文分词测试，我们来看看效果。", "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장을 토큰화합니다.", "العربية نص من اليمين إلى اليسار ١٢٣٤", "עברית מימין לשמאל",
    "हिन्दी में लिखा गया वाक्य", "ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu", "ქართული ენა",
    "e\u0301 a\u0308 o\u0302\u0323 n\u0303", "Z\u0351\u036b\u0343a\u0310\u0352l\u0350g\u0357o",
    "🎉🚀👍🏽👨‍👩‍👧‍👦🇫🇷🏳️‍🌈", "∑∫√∞≠≤≥ ⊕⊗ ℝℕℤ", "Ⅻ ⅷ ½ ¾ ² ³ ₁₂ ①②", "\u200b\u200c\u200d\ufeff",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝 𝟙𝟚𝟛", "\U00020000\U0002a6d6 \U0001f600", "ﬁﬂ ﬀ Å Ω K µ",
]
WHITESPACE = [
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\x0b",
    "\x0c",
    "\x85",
    "\u2009",
]


def _sentence(r: random.Random) -> str:
    words = []
    for _ in range(r.randint(3, 14)):
        w = r.choice(WORDS)
        if r.random() < 0.15:
            w = w.capitalize() if r.random() < 0.7 else w.upper()
        if r.random() < 0.1:
            w += r.choice(CONTRACTIONS)
        words.append(w)
    s = " ".join(words)
    return s[0].upper() + s[1:] + r.choice([".", "!", "?", "...", ",", ";", " .", " ?"])


def _prose(r: random.Random) -> str:
    return " ".join(_sentence(r) for _ in range(r.randint(1, 4)))


def _ident(r: random.Random) -> str:
    return r.choice(["x", "self", "n_tokens", "kvCache", "_private", "__init__", "i", "buf2", "ĝeneric"])


def _python(r: random.Random) -> str:
    ind = r.choice(["    ", "\t", "  "])
    a, b = _ident(r), _ident(r)
    return r.choice([
        f"def {a}({b}, *args, **kw):\n{ind}return {b} + {r.randint(0, 999)}\n",
        f"class {a.title()}:\n{ind}\"\"\"Doc.\"\"\"\n\n{ind}def __repr__(self) -> str:\n{ind * 2}return f'{{self.{b}!r}}'\n",
        f"for {a} in range({r.randint(1, 10**6)}):\n{ind}if {a} % 3 == 0:\n{ind * 2}continue\n",
        f"{a} = [{b} ** 2 for {b} in {a}s if {b}]  # comment: {_sentence(r)}",
        f"import numpy as np\n\n{a} = np.zeros(({r.randint(1, 64)}, {r.randint(1, 64)}), dtype=np.float16)\n",
        f"    try:\n        {a}()\n    except Exception as e:\n        raise RuntimeError('{b}') from e\n",
    ])


def _c(r: random.Random) -> str:
    a, b = _ident(r), _ident(r)
    return r.choice([
        f"static int {a}(const char *{b}, size_t n) {{\n\tfor (size_t i = 0; i < n; ++i) {{\n\t\tif (!{b}[i]) return -1;\n\t}}\n\treturn 0;\n}}\n",
        f"#include <stdio.h>\n#define MAX_{a.upper()} {r.randint(1, 4096)}\n",
        f"    {a} = ({b} >> 4) & 0x{r.randint(0, 255):02X}; /* {_sentence(r)} */",
        f"if ({a} != NULL && {b}->len >= {r.randint(0, 99)}) {{ return {a}; }}",
        f"struct {a} {{ uint32_t {b}[{r.randint(1, 16)}]; float scale; }};",
    ])


def _json(r: random.Random) -> str:
    obj = {
        "id": r.randint(0, 10**9),
        "name": r.choice(WORDS),
        "tags": [r.choice(WORDS) for _ in range(r.randint(0, 4))],
        "score": round(r.uniform(-1000, 1000), r.randint(0, 6)),
        "ok": r.random() < 0.5,
        "nested": {"unicode": r.choice(SCRIPTS)[:12], "null": None},
    }
    return json.dumps(obj, ensure_ascii=r.random() < 0.3, indent=r.choice([None, 2, "\t"]))


def _number(r: random.Random) -> str:
    return r.choice([
        str(r.randint(0, 10 ** r.randint(1, 20))),
        f"{r.uniform(-1e6, 1e6):.{r.randint(0, 8)}f}",
        f"{r.randint(1900, 2100)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
        f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}",
        f"{r.randint(1, 999):,}{r.randint(0, 999_999):,}",
        f"v{r.randint(0, 9)}.{r.randint(0, 99)}.{r.randint(0, 999)}",
        f"{r.randint(1, 99)}% of {r.randint(1, 10**6)} ({r.random():.3e})",
        f"+1 ({r.randint(100, 999)}) {r.randint(100, 999)}-{r.randint(1000, 9999)}",
        "١٢٣٤٥ ۱۲۳ १२३ ௧௨௩ ໑໒ 一二三 ⅠⅡⅢ",
        f"0x{r.getrandbits(32):08x} 0b{r.getrandbits(8):08b} 1e{r.randint(-30, 30)}",
        f"{r.randint(1, 31)}/{r.randint(1, 12)}/{r.randint(0, 99):02d}, {r.randint(1, 12)}am",
    ])


def _whitespace(r: random.Random) -> str:
    parts = []
    for _ in range(r.randint(1, 8)):
        parts.append("".join(r.choice(WHITESPACE) for _ in range(r.randint(1, 6))))
        if r.random() < 0.6:
            parts.append(r.choice([r.choice(WORDS), r.choice(PUNCT), str(r.randint(0, 99)), "'s"]))
    return "".join(parts)


def _unicode(r: random.Random) -> str:
    s = r.choice(SCRIPTS)
    if r.random() < 0.5:
        i = r.randrange(len(s) + 1)
        s = s[:i] + r.choice([" ", "", r.choice(SCRIPTS), r.choice(WORDS), "\n"]) + s[i:]
    if r.random() < 0.3:
        s = "".join(chr(r.randint(0x80, 0x2FFF)) for _ in range(r.randint(1, 12)))
    return s


def _with_special(r: random.Random) -> str:
    parts = []
    for _ in range(r.randint(1, 6)):
        parts.append(r.choice(SPECIAL_TEXTS))
        parts.append(r.choice(["", " ", "\n", "  ", _sentence(r), r.choice(WORDS), r.choice(SCRIPTS)[:6]]))
    return "".join(parts)


def _mixture(r: random.Random, makers: list) -> str:
    return "".join(r.choice(makers)(r) for _ in range(r.randint(2, 5)))


def corpus_by_kind(seed: int = 20240531) -> dict[str, list[str]]:
    """The corpus grouped by kind of text."""
    r = random.Random(seed)
    makers = [_prose, _python, _c, _json, _number, _whitespace, _unicode, _with_special]
    out: dict[str, list[str]] = {
        "prose": [_prose(r) for _ in range(400)],
        "code": [r.choice([_python, _c, _json])(r) for _ in range(300)],
        "numbers": [_number(r) for _ in range(250)],
        "whitespace": [_whitespace(r) for _ in range(250)],
        "unicode": [_unicode(r) for _ in range(400)],
        "special": [_with_special(r) for _ in range(300)],
        "short": ["", *string.printable, *"éßø中😀\u0301\u00a0\u3000\u2028\x00\x7f\x85ÿ\ufffd€",
                  *(" " * k for k in range(2, 9)), *("\n" * k for k in range(2, 6)), "''", "'s", " 's"],
        "mixture": [_mixture(r, makers) for _ in range(300)],
        "long": ["\n\n".join(_mixture(r, makers) for _ in range(r.randint(20, 60))) for _ in range(12)],
    }
    return out


def corpus(seed: int = 20240531) -> list[str]:
    """All corpus strings, in a fixed order."""
    return [s for group in corpus_by_kind(seed).values() for s in group]
