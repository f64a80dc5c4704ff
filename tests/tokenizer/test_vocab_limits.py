"""A vocabulary with an absurd number of control tokens is refused when the tokenizer loads, by
name, instead of costing seconds at the first request (the special-token regex over 200k texts
took 3-5 s to build); vocabularies with as many as real models have still match every one."""

from __future__ import annotations

from pathlib import Path

import gguf_bytes as gb
import pytest

from edge_infer.errors import UnsupportedModelError
from edge_infer.tokenizer import Tokenizer
from edge_infer.tokenizer.vocab import MAX_SPECIAL_TOKENS


def control_vocab(path: Path, n_control: int) -> Path:
    """A gpt2 vocabulary of three plain tokens and n_control control tokens <|c0|>, <|c1|>, ..."""
    tokens = ["a", "b", "ab"] + [f"<|c{i}|>" for i in range(n_control)]
    g = (gb.RawGGUF()
         .kv("tokenizer.ggml.model", gb.STR, "gpt2")
         .kv("tokenizer.ggml.pre", gb.STR, "qwen2")
         .kv("tokenizer.ggml.tokens", gb.ARR, tokens, gb.STR)
         .kv("tokenizer.ggml.token_type", gb.ARR, [1, 1, 1] + [3] * n_control, gb.I32)
         .kv("tokenizer.ggml.merges", gb.ARR, ["a b"], gb.STR))
    path.write_bytes(g.build())
    return path


def test_two_hundred_thousand_control_tokens_are_refused_at_load(tmp_path: Path) -> None:
    path = control_vocab(tmp_path / "v.gguf", 200_000)
    with pytest.raises(UnsupportedModelError, match=rf"v\.gguf: 200000 control, user-defined and unknown tokens "
                       rf"\(tokenizer\.ggml\.token_type\), more than the {MAX_SPECIAL_TOKENS} edge-infer looks for"):
        Tokenizer.from_gguf(path)


def test_as_many_as_a_real_vocabulary_are_all_matched(tmp_path: Path) -> None:
    """gemma3 has ~6.4k special tokens: more than that still loads and matches every text."""
    n = 7000
    tok = Tokenizer.from_gguf(control_vocab(tmp_path / "v.gguf", n))
    ids = tok.encode(f"ab<|c{n - 1}|>b<|c7|><|c70|>a", add_special=False, parse_special=True)
    assert ids == [2, 3 + n - 1, 1, 3 + 7, 3 + 70, 0]
