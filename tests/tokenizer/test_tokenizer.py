"""Tokenizer unit tests that need no llama.cpp: splitting rules, special-token order,
streaming decode, metadata errors, load and encode speed on the real models."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_infer.errors import EdgeInferError, TokenizerError, UnsupportedModelError
from edge_infer.tokenizer import Tokenizer
from edge_infer.tokenizer.detok import IncrementalDetokenizer, clean_spaces
from edge_infer.tokenizer.pretok import PreTokenizer, collapse
from edge_infer.tokenizer.special import SpecialMatcher, trie_regex
from edge_infer.tokenizer.vocab import load_vocab


# -- pre-tokenizers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("splitter", "text", "words"),
    [
        ("gpt2", "I'm   fine", ["I", "'m", "  ", " fine"]),
        ("gpt2", "I'M ok", ["I", "'", "M", " ok"]),  # gpt2 contractions are case sensitive
        ("qwen2", "I'M ok", ["I", "'M", " ok"]),
        ("qwen2", "x 12345", ["x", " ", "1", "2", "3", "4", "5"]),
        ("llama3", "x 12345", ["x", " ", "123", "45"]),
        ("starcoder", "a  12", ["a", "  ", "1", "2"]),  # digits cut first: the spaces end a span
        ("gpt2", "a  12", ["a", " ", " 12"]),
        ("qwen2", "a  \n\n b", ["a", "  \n\n", " b"]),
        ("qwen2", "\tword", ["\tword"]),
        ("gpt2", "e\u0301t\u00e9", ["e", "\u0301", "t\u00e9"]),  # a combining mark is no letter
        ("qwen2", "a\u3000\u3000b", ["a", "\u3000", "\u3000b"]),
        ("default", "x+=1;", ["x", "+=", "1", ";"]),
        ("default", "1234567", ["123", "456", "7"]),
    ],
)
def test_pre_tokenizer_splits(splitter: str, text: str, words: list[str]) -> None:
    assert PreTokenizer(splitter).split(text) == words


def test_collapse_keeps_length_and_classes() -> None:
    text = "aé中١\u3000\u0301!€\U0001f600\x85"
    c = collapse(text)
    assert len(c) == len(text)
    assert c == "a\xd2\xd2\xd1\x0b\xd4!\xd5\xd5\x0b"
    assert collapse("plain ascii") == "plain ascii"


# -- special tokens ---------------------------------------------------------------------------
def test_trie_regex_prefers_longest() -> None:
    import re

    rx = re.compile(trie_regex(["<a>", "<a>>", "<ab>", "\n", "\n\n"]))
    assert [m.group() for m in rx.finditer("<a>> <ab> \n\n\n")] == ["<a>>", "<ab>", "\n\n", "\n"]


def test_special_matcher_takes_longer_tokens_first() -> None:
    # llama.cpp's order: "a>b>" (longer) is cut out before "<a>" is looked for.
    m = SpecialMatcher([("a>b>", 1), ("<a>", 2)], set(), set())
    assert m.partition("<a>b>") == ["<", 1]
    assert m.partition("x<a>y<a>") == ["x", 2, "y", 2]
    assert m.partition("") == []


def test_special_matcher_strips_whitespace() -> None:
    m = SpecialMatcher([("<x>", 7)], lstrip={7}, rstrip={7})
    assert m.partition("a  <x>\n b<x>") == ["a", 7, "b", 7]


# -- decoding helpers -------------------------------------------------------------------------
def test_clean_spaces_rules() -> None:
    assert clean_spaces(b"Hello , world . Is it ? Yes !") == b"Hello, world. Is it? Yes!"
    assert clean_spaces(b"a ' b") == b"a'b"
    assert clean_spaces(b"it 's we 're I 'm they 've") == b"it's we're I'm they've"
    assert clean_spaces(b"don 't we 'd we 'll") == b"don 't we 'd we 'll"


class _Pieces:
    """A stand-in tokenizer whose token i is pieces[i]."""

    def __init__(self, pieces: list[bytes], clean: bool, space_prefix: bool = False) -> None:
        self.pieces, self.clean_spaces, self.add_space_prefix = pieces, clean, space_prefix

    def token_to_piece(self, i: int, special: bool = True) -> bytes:
        return self.pieces[i]


def _oneshot(pieces: list[bytes], clean: bool, space_prefix: bool) -> str:
    data = list(pieces)
    if data and space_prefix and data[0][:1] == b" ":
        data[0] = data[0][1:]
    raw = b"".join(data)
    return (clean_spaces(raw) if clean else raw).decode("utf-8", "replace")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    pieces=st.lists(
        st.binary(max_size=4) | st.sampled_from([b" ", b"'", b" '", b"s", b"re", b".", "é😀".encode()]),
        max_size=25,
    ),
    clean=st.booleans(),
    space_prefix=st.booleans(),
)
def test_incremental_detokenizer_equals_oneshot(pieces: list[bytes], clean: bool, space_prefix: bool) -> None:
    fake = _Pieces(pieces, clean, space_prefix)
    detok = IncrementalDetokenizer(fake)  # type: ignore[arg-type]
    out = [detok.add(i) for i in range(len(pieces))]
    assert "".join(out) + detok.flush() == _oneshot(pieces, clean, space_prefix)
    try:
        b"".join(pieces).decode("utf-8")
    except UnicodeDecodeError:
        return
    assert not any("\ufffd" in o for o in out)  # valid input: no character is ever cut


def test_incremental_detokenizer_holds_split_characters() -> None:
    emoji = "😀".encode()
    detok = IncrementalDetokenizer(_Pieces([emoji[:1], emoji[1:3], emoji[3:], b"!"], clean=False))  # type: ignore[arg-type]
    assert [detok.add(i) for i in range(4)] == ["", "", "😀", "!"]
    assert detok.flush() == ""


# -- metadata errors --------------------------------------------------------------------------
def _meta(**kw: object) -> dict[str, object]:
    meta: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "<|endoftext|>"],
        "tokenizer.ggml.token_type": [1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.eos_token_id": 3,
    }
    meta.update(kw)
    return {k: v for k, v in meta.items() if v is not None}


def test_tiny_vocab_works() -> None:
    tok = Tokenizer(load_vocab(_meta()))
    assert tok.encode("abab") == [2, 2]
    assert tok.encode("ab<|endoftext|>", parse_special=True) == [2, 3]
    assert tok.stop_ids == {3}
    assert tok.decode([2, 3]) == "ab<|endoftext|>"
    assert tok.decode([2, 3], skip_special=True) == "ab"


@pytest.mark.parametrize(
    ("change", "error", "words"),
    [
        ({"tokenizer.ggml.model": "t5"}, UnsupportedModelError, "'t5'"),
        ({"tokenizer.ggml.model": None}, TokenizerError, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.pre": "no-such-pre"}, UnsupportedModelError, "'no-such-pre'"),
        ({"tokenizer.ggml.tokens": []}, TokenizerError, "tokens"),
        ({"tokenizer.ggml.merges": None}, TokenizerError, "merges"),
        ({"tokenizer.ggml.token_type": [1]}, TokenizerError, "token_type"),
        ({"tokenizer.ggml.tokens": "abc"}, TokenizerError, "tokenizer.ggml.tokens"),
    ],
)
def test_bad_metadata_is_named(change: dict[str, object], error: type[EdgeInferError], words: str) -> None:
    with pytest.raises(error, match=words):
        load_vocab(_meta(**change), "model.gguf")


def test_bad_ids_raise() -> None:
    tok = Tokenizer(load_vocab(_meta()))
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([99])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.token_to_piece(-1)


# -- real models ------------------------------------------------------------------------------
# Speed checks count this process's CPU time, so other work on a shared machine does not
# make them fail; the best of two tries is taken.
@pytest.mark.slow
def test_from_gguf_is_fast(gemma3_path: Path) -> None:
    best = min(_cpu_seconds(lambda: Tokenizer.from_gguf(gemma3_path)) for _ in range(2))
    assert best < 1.0, f"Tokenizer.from_gguf took {best:.2f}s for the 262k-token gemma vocab"


@pytest.mark.slow
def test_encode_one_megabyte_under_a_second(any_real_model: Path) -> None:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    text = (text * (1 + (1 << 20) // len(text)))[: 1 << 20]  # 1 MiB of English (Python docs)
    # a fresh tokenizer each time: its word caches start empty
    best = min(_cpu_seconds(Tokenizer.from_gguf(any_real_model).encode, text) for _ in range(2))
    assert best < 1.0, f"encoding 1 MiB took {best:.2f}s of CPU"


@pytest.mark.slow
def test_real_model_properties(smollm2_path: Path, gemma3_path: Path, qwen2_path: Path) -> None:
    smol, gemma, qwen = (Tokenizer.from_gguf(p) for p in (smollm2_path, gemma3_path, qwen2_path))
    assert (smol.vocab_size, smol.bos_id, smol.eos_id, smol.add_bos) == (49152, 1, 2, False)
    assert smol.stop_ids == {0, 2, 4}  # <|endoftext|>, <|im_end|> and <reponame> (llama.cpp: fim_rep)
    assert (gemma.vocab_size, gemma.bos_id, gemma.eos_id, gemma.add_bos) == (262144, 2, 1, True)
    assert {gemma.token_id("<end_of_turn>"), gemma.eos_id} <= gemma.stop_ids
    assert qwen.token_id("<|im_end|>") in qwen.stop_ids and qwen.token_id("<|endoftext|>") in qwen.stop_ids
    assert gemma.token_to_piece(gemma.token_id("<0x0A>")) == b"\n"
    assert gemma.token_to_piece(gemma.bos_id, special=False) == b""
    assert gemma.is_special(gemma.bos_id) and not gemma.is_special(gemma.token_id("<0x0A>"))
    assert qwen.token_to_piece(qwen.token_id("Ġthe")) == b" the"
    assert gemma.encode("Hi")[0] == gemma.bos_id and smol.encode("Hi")[0] != smol.bos_id
    # special-token text is text unless parsing is asked for
    im_end = smol.token_id("<|im_end|>")
    assert im_end not in smol.encode("a<|im_end|>b") and im_end in smol.encode(
        "a<|im_end|>b", parse_special=True
    )


@pytest.mark.slow
def test_streaming_decode_is_per_token_cheap(qwen2_path: Path) -> None:
    tok = Tokenizer.from_gguf(qwen2_path)
    ids = tok.encode("Streaming ünïcödé text, emoji 🧬🎉 and 中文字符. " * 400)
    detok = tok.detokenizer()
    start = time.process_time()
    parts = [detok.add(i) for i in ids]
    elapsed = time.process_time() - start
    assert "".join(parts) + detok.flush() == tok.decode(ids)
    assert not any("\ufffd" in p for p in parts)
    assert elapsed / len(ids) < 50e-6, f"{elapsed / len(ids) * 1e6:.1f} µs per token"


def _cpu_seconds(fn: Callable[..., object], *args: object) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start
