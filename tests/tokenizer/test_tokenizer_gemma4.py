"""Gemma 4's tokenizer (GGUF model "gemma4": SentencePiece-style BPE) against llama.cpp.

A small synthetic vocabulary (vocab-only GGUF) holds U+2581-prefixed pieces, merges whose
result is no token, newline tokens, <0xXX> byte tokens and control tokens. Our encode and
decode must give llama.cpp's ids and bytes; the same vocabulary is also loaded as a gpt2
model with the pre-tokenizers llama.cpp runs the same way (granite-embed, sarvam-moe).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from edge_infer.tokenizer import Tokenizer

llama_cpp = pytest.importorskip("llama_cpp")

SP = "\u2581"
CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["hello", "world", "the", "is", "ing", "你"]
MERGES = [
    f"{SP} {SP}", f"{SP}{SP} {SP}{SP}", "h e", "l l", "he ll", "hell o", "w o", "r l", "wo rl", "worl d",
    "t h", "th e", "i s", "i n", "in g", f"{SP} t", f"{SP}t he", f"{SP} h", f"{SP}h ello", f"{SP} w",
    f"{SP}w orld", f"{SP} i", f"{SP}i s", "x y", f"{SP} x", "\n \n", ". \n",
]
TEXTS = [
    "", " ", "  ", "    ", "hello", " hello", "hello ", "hello world", "hello  world", "  the   thing  ",
    "the world is hello", "xyz xy", "\n", "\n\n", "\n\n\n", "\n\n\n\n", "\n\n\n\n\n", "a\n\nb\n", " \n \n\n ",
    "tab\there\t\tx", "你好, world!", "emoji 😀 and é", "Hello, World. It's 'quoted' ok ?",
    "<bos>hello<eos>", "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "<|turn>user\nthe\n\n<turn|>", "<mask> <unk>", "x" * 50 + " " + "ing" * 20, ".\n.\n\n",
]
VARIANTS = {
    "gemma4": {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.pre": "gemma4", "tokenizer.ggml.add_bos_token": False},
    "gemma4-pre-ignored": {"tokenizer.ggml.model": "gemma4", "tokenizer.ggml.pre": "qwen2"},
    "granite-embed": {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "granite-embed-multi-311m"},
    "sarvam-moe": {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "sarvam-moe"},
}


def _vocab() -> tuple[list[str], list[int]]:
    tokens = list(CONTROL)
    types = [3] * len(CONTROL)
    types[CONTROL.index("<unk>")] = 2
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    normal = [SP, *"abcdefghijklmnopqrstuvwxyzHWI.,!?'é", "\n", "\n\n", "\n\n\n\n", "\t"]
    for m in MERGES:
        a, b = m.split(" ")
        normal += [a, b, a + b]
    normal += WORDS + [SP + w for w in WORDS] + [f"{SP}{SP}{SP}{SP}"]
    normal = [t for t in dict.fromkeys(normal) if t not in ("xy", f"{SP}x", ".\n")]  # merges without tokens
    tokens += normal
    types += [1] * len(normal)
    tokens.append("\t\t")  # user-defined: matched in the text before BPE
    types.append(4)
    return tokens, types


def _write(path: Path, overrides: dict[str, object]) -> None:
    from gguf import GGUFWriter

    tokens, types = _vocab()
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model(str(overrides["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(str(overrides["tokenizer.ggml.pre"]))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(CONTROL.index("<bos>"))
    w.add_eos_token_id(CONTROL.index("<eos>"))
    w.add_unk_token_id(CONTROL.index("<unk>"))
    w.add_pad_token_id(CONTROL.index("<pad>"))
    if "tokenizer.ggml.add_bos_token" in overrides:
        w.add_add_bos_token(bool(overrides["tokenizer.ggml.add_bos_token"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
        out = ctypes.create_string_buffer(64 + 16 * len(ids))
        n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, len(out), False, special)
        assert n >= 0
        return out.raw[:n]

    def piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, 64, 0, special)
        assert 0 <= n <= 64
        return buf.raw[:n]


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, _Oracle]:
    path = tmp_path_factory.mktemp("gemma4") / f"{request.param}.gguf"
    _write(path, VARIANTS[request.param])
    return Tokenizer.from_gguf(path), _Oracle(path)


def test_encode_matches_llama(pair: tuple[Tokenizer, _Oracle]) -> None:
    tok, oracle = pair
    bad = [
        (s, add, parse, tok.encode(s, add, parse), oracle.tokenize(s, add, parse))
        for s in TEXTS for add in (False, True) for parse in (False, True)
        if tok.encode(s, add, parse) != oracle.tokenize(s, add, parse)
    ]
    assert not bad, f"{len(bad)} encodings differ, first: {bad[:3]}"


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


def test_gemma4_vocab_flags(pair: tuple[Tokenizer, _Oracle]) -> None:
    tok, _ = pair
    if tok.clean_spaces is False:
        pytest.skip("sarvam-moe: no gemma4 extras")
    assert tok.add_bos and tok.bos_id == CONTROL.index("<bos>")  # forced on for gemma4 pre-tokenizers
    # the newline runs that are tokens are taken whole; three newlines merge as BPE does
    nl, nl2 = tok.token_id("\n"), tok.token_id("\n\n")
    assert tok.encode("\n\n\n", add_special=False) == [nl2, nl]
    assert tok.encode("\n\n\n\n", add_special=False) == [tok.token_id("\n\n\n\n")]  # no merge makes it
    assert tok.encode("你好", add_special=False) == [tok.token_id("你"), *(tok.token_id(f"<0x{b:02X}>") for b in "好".encode())]
    assert tok.decode(tok.encode(" hello  world ", add_special=False)) == " hello  world "
    assert {tok.token_id("<eos>"), tok.token_id("<turn|>"), tok.token_id("<end_of_turn>")} <= tok.stop_ids
