"""WordPiece (GGUF model "bert", llama.cpp's WPM) against llama.cpp, on all-MiniLM-L6-v2's vocabulary.

The vocabulary is written into vocab-only GGUFs as llama.cpp's converter writes it (bert_vocab),
with the keys MiniLM's HF files give, with no keys at all (llama.cpp's WPM defaults) and with the
normalizer switched (cased; lower-cased but accents kept). Our ids, special ids, flags, token
attributes, pieces and decoded bytes must be llama.cpp's.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest
from bert_vocab import MINILM_FLAGS, MINILM_IDS, minilm_dir, minilm_vocab, write_bert_vocab_gguf
from tokenizer_corpus import corpus

from edge_infer.errors import TokenizerError
from edge_infer.tokenizer import Tokenizer
from edge_infer.tokenizer.wpm import wpm_words

llama_cpp = pytest.importorskip("llama_cpp")

TEXTS = [
    "", " ", "\t\n  \r\n", "Hello, world!", "HELLO World hello", "The quick brown fox jumps over the lazy dog.",
    "unaffable", "café", "naïve résumé", "Ångström", "Crème brûlée à la mode", "Straße Größe ẞ", "ΑΣ Σίσυφος",
    "İstanbul ıi", "中文字符", "日本語のテキスト", "我想在apple工作1314151天～", "한국어 문장을 토큰화합니다.",
    "Русский текст с ёжиком", "emoji 😀🎉👍🏽 and ✨", "!!!???...,,,;;;", "--==>><<~~``", "(a)[b]{c}<d>",
    "$100 + 50% = #1 @home ^_^ |pipe|", "3.14159 2024-01-01 1,000,000", "12345678901234567890", "x" * 120,
    "a" * 101 + "b", "supercalifragilisticexpialidocious" * 4, "pneumonoultramicroscopicsilicovolcanoconiosis",
    "MixedCASE camelCase snake_case kebab-case", "tab\tseparated\tvalues\nnew line\r\nwindows",
    "I've been 'told' he's there, 'RE you sure?", "don't can't won't", "[CLS] query [SEP] document [SEP]",
    "[MASK] is [MASK].", "[PAD][UNK][cls][Sep]", "[CLS][SEP]", "x[MASK]y", "[unused0] [unused1]",
    "e\u0301 a\u0308 o\u0302\u0323", "zero\u200bwidth\u200cjoin\ufeffbom", "a\x00b\x1fc\x7fd\x85e",
    "\ufffd replacement", "non\u00a0breaking\u3000ideographic\u2009thin", "ﬁﬂ ﬀ Å Ω K µ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝",
    "\U00020000\U0002a6d6 \U0002b820\U0002b920", "ﾊﾝｶｸ ｶﾀｶﾅ ＡＢＣ", "https://example.com/path?q=1&x=2#frag",
    "def f(x):\n    return x**2  # comment", "ᄒᄀ ᄋ", "kannada \u0cf3 kawi \U00011f43",
    "\u2581hello \u2581 a\u2581b", "##s ##ing", "[UNK]",
]
VARIANTS: dict[str, dict[str, Any]] = {
    "minilm": {},  # the keys the converter writes from MiniLM's HF files
    "defaults": {"ids": {}, "flags": {}},  # no special-id keys or flags: llama.cpp's WPM defaults
    "cased": {"flags": {**MINILM_FLAGS, "normalizer.lowercase": False}},  # strip_accents follows lowercase
    "keep-accents": {"flags": {**MINILM_FLAGS, "normalizer.strip_accents": False}},
}


class _Oracle:
    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, parse_special)
        assert n >= 0
        return list(buf[:n])

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        out = ctypes.create_string_buffer(64 + 32 * len(ids))
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, len(out), False, special)
        assert n >= 0
        return out.raw[:n]

    def piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, 64, 0, special)
        assert 0 <= n <= 64
        return buf.raw[:n]

    def special_id(self, name: str) -> int | None:
        i = getattr(llama_cpp, f"llama_vocab_{name}")(self.vocab)
        return None if i < 0 else i


@pytest.fixture(scope="module")
def vocab() -> list[str]:
    return minilm_vocab()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         vocab: list[str]) -> tuple[Tokenizer, _Oracle]:
    path = tmp_path_factory.mktemp("wpm") / f"{request.param}.gguf"
    write_bert_vocab_gguf(path, vocab, **VARIANTS[request.param])
    return Tokenizer.from_gguf(path), _Oracle(path)


def test_encode_matches_llama(pair: tuple[Tokenizer, _Oracle]) -> None:
    tok, oracle = pair
    bad = [
        (s, add, parse, ours, ref)
        for s in TEXTS for add in (False, True) for parse in (False, True)
        if (ours := tok.encode(s, add, parse)) != (ref := oracle.tokenize(s, add, parse))
    ]
    assert not bad, f"{len(bad)} encodings differ, first: {bad[:3]}"


def test_corpus_matches_llama(pair: tuple[Tokenizer, _Oracle]) -> None:
    tok, oracle = pair
    texts = [s for s in corpus() if s.encode("utf-8", "replace").decode() == s]
    bad = [s for s in texts if tok.encode(s, True, True) != oracle.tokenize(s, True, True)]
    assert not bad, f"{len(bad)} of {len(texts)} corpus strings differ, first: {bad[:3]}"


def test_special_ids_flags_and_attrs_match_llama(pair: tuple[Tokenizer, _Oracle]) -> None:
    tok, oracle = pair
    assert tok.kind == "wpm"
    assert (tok.bos_id, tok.eos_id, tok.sep_id) == tuple(map(oracle.special_id, ("bos", "eos", "sep")))
    assert (tok.add_bos, tok.add_eos, tok.add_sep) == (
        llama_cpp.llama_vocab_get_add_bos(oracle.vocab), llama_cpp.llama_vocab_get_add_eos(oracle.vocab),
        llama_cpp.llama_vocab_get_add_sep(oracle.vocab),
    )
    assert tok.stop_ids == {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(oracle.vocab, i)}
    assert [tok.token_attr(i) for i in range(tok.vocab_size)] == [
        llama_cpp.llama_vocab_get_attr(oracle.vocab, i) for i in range(tok.vocab_size)
    ]


def test_minilm_special_tokens(pair: tuple[Tokenizer, _Oracle], request: pytest.FixtureRequest) -> None:
    tok, _ = pair
    name = request.node.callspec.params["pair"]
    assert (tok.bos_id, tok.sep_id) == (101, 102)  # [CLS], [SEP]
    if name == "defaults":  # llama.cpp's WPM defaults: no EOS, SEP between a pair's texts
        assert (tok.eos_id, tok.add_bos, tok.add_eos, tok.add_sep) == (None, True, False, True)
    else:  # the converter reads EOS from sep_token and add_eos from "[CLS] $A [SEP]"
        assert (tok.eos_id, tok.add_bos, tok.add_eos, tok.add_sep) == (102, True, True, False)
    if name != "cased":
        assert tok.encode("Hello, world!") == [101, 7592, 1010, 2088, 999, 102]
        assert tok.encode("Hello, world!", add_special=False) == [7592, 1010, 2088, 999]
    assert tok.encode("[SEP]", add_special=False, parse_special=True) == [102]
    assert tok.encode("") == [101, 102]


def test_decode_matches_llama(pair: tuple[Tokenizer, _Oracle]) -> None:
    tok, oracle = pair
    for i in range(tok.vocab_size):
        for special in (False, True):
            assert tok.token_to_piece(i, special) == oracle.piece(i, special), (i, tok.token_text(i))
    for s in TEXTS:
        ids = oracle.tokenize(s, True, True)
        for special in (False, True):
            ref = oracle.detokenize(ids, special)
            assert tok.decode_bytes(ids, skip_special=not special) == ref, (s, special)
            detok = tok.detokenizer(skip_special=not special)
            assert detok.add_many(ids) + detok.flush() == ref.decode("utf-8", "replace"), (s, special)


def test_decode_round_trip(pair: tuple[Tokenizer, _Oracle], request: pytest.FixtureRequest) -> None:
    tok, _ = pair
    if request.node.callspec.params["pair"] in ("cased", "keep-accents"):
        pytest.skip("an uncased, accent-free vocabulary cannot spell cased or accented text")
    # no leading-space removal for WPM (add_space_prefix is off); " ," and " !" are cleaned up
    assert tok.decode(tok.encode("Hello, World! It's naïve.")) == "[CLS] hello, world! it's naive.[SEP]"
    assert tok.decode(tok.encode("unaffable  tokens"), skip_special=True) == " unaffable tokens"


def test_minilm_keys_are_the_converters(vocab: list[str]) -> None:
    """gguf-py's SpecialVocab on MiniLM's HF files gives the keys write_bert_vocab_gguf writes."""
    gguf = pytest.importorskip("gguf")
    sv = gguf.SpecialVocab(minilm_dir(), n_vocab=len(vocab))
    ids = {role: vocab.index(text) for role, text in MINILM_IDS.items()}
    assert sv.special_token_ids == {**ids, "cls": 101}  # no GGUF key for cls: the converter skips it
    assert {f"add_{k}_token": v for k, v in sv.add_special_token.items()}.items() <= MINILM_FLAGS.items()


def test_words_follow_llama(vocab: list[str]) -> None:
    """llm_tokenizer_wpm_session::preprocess, including where it differs from HF's BertNormalizer."""
    assert wpm_words("Héllo, 世界!\tx\u200by a\x1fb") == ["hello", ",", "世", "界", "!", "xy", "ab"]
    assert wpm_words("한국") == ["ᄒᄀ"]  # NFD keeps only a syllable's first code point, its leading jamo
    assert wpm_words("Ａ$b\u0301c", lowercase=False) == ["Ａ", "$", "bc"]  # marks dropped, ASCII symbols alone
    assert wpm_words("ÀÉ", lowercase=False, strip_accents=False) == ["ÀÉ"]


def test_long_words_are_not_unknown(pair: tuple[Tokenizer, _Oracle]) -> None:
    """HF's WordPiece makes a word over 100 characters [UNK]; llama.cpp has no such limit."""
    tok, oracle = pair
    ids = tok.encode("a" * 150, add_special=False)
    assert len(ids) > 1 and tok.token_id("[UNK]") not in ids
    assert ids == oracle.tokenize("a" * 150, False, False)


# -- malformed vocabularies ------------------------------------------------------------------
SMALL = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", ",", "[UNK]"]


def test_no_unknown_token_refuses_unknown_words(tmp_path: Path) -> None:
    path = write_bert_vocab_gguf(tmp_path / "v.gguf", SMALL[:-1], ids={"bos": "[CLS]", "sep": "[SEP]"})
    tok, oracle = Tokenizer.from_gguf(path), _Oracle(path)
    assert tok.encode("Hellos, world") == oracle.tokenize("Hellos, world", True, False) == [1, 4, 6, 7, 5, 2]
    assert oracle.tokenize("xyz", False, False) == [-1]  # llama.cpp emits the null token
    with pytest.raises(TokenizerError, match=r"'xyz' has no WordPiece tokens .*tokenizer\.ggml\.unknown_token_id"):
        tok.encode("hello xyz")


def test_no_separator_refuses_add_special(tmp_path: Path) -> None:
    """llama.cpp aborts (GGML_ASSERT) here; we raise naming the key."""
    path = write_bert_vocab_gguf(tmp_path / "v.gguf", SMALL, ids={"bos": "[CLS]", "unk": "[UNK]"})
    tok = Tokenizer.from_gguf(path)
    assert tok.sep_id is None and tok.encode("hello xyz", add_special=False) == [4, 8]
    with pytest.raises(TokenizerError, match=r"no SEP token to add \(tokenizer\.ggml\.seperator_token_id\)"):
        tok.encode("hello")


def test_out_of_range_special_ids_fall_back_as_in_llama(tmp_path: Path, vocab: list[str]) -> None:
    """llama.cpp warns and keeps its default id for a key out of range; so do we."""
    ids: dict[str, int | str | None] = {"bos": 10**6, "unk": 40000, "sep": "[SEP]", "mask": len(vocab)}
    path = write_bert_vocab_gguf(tmp_path / "v.gguf", vocab, ids=ids)
    tok, oracle = Tokenizer.from_gguf(path), _Oracle(path)
    assert (tok.bos_id, tok.sep_id) == (101, 102)
    for s in ("hello ☃ world", "[MASK] x", ""):
        assert tok.encode(s, True, True) == oracle.tokenize(s, True, True), s
