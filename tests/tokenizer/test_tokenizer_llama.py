"""Our tokenizer against llama.cpp (llama-cpp-python's bundled build) on the real models.

Every corpus string and Hypothesis-generated text must give the same ids as
llama_tokenize for all add_special/parse_special combinations, and decoding (whole and
token by token) must give llama_detokenize's bytes. Other pre-tokenizers and SPM with a
space prefix are checked on vocab-only GGUF copies with the metadata changed.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_corpus import SPECIAL_TEXTS, corpus

from edge_infer.tokenizer import Tokenizer

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.slow

FLAGS = [(a, p) for a in (False, True) for p in (False, True)]


class LlamaOracle:
    """llama.cpp's vocabulary through the C API (no per-call context-sized buffers)."""

    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode()
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        assert n >= 0
        return list(buf[:n])

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        while True:
            out = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), out, size, False, special)
            if n >= 0:
                return out.raw[:n]
            size = -n + 1

    def piece(self, token_id: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(1024)
        n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, 1024, 0, special)
        assert 0 <= n <= 1024
        return buf.raw[:n]


@pytest.fixture(scope="module")
def pair(any_real_model: Path) -> tuple[Tokenizer, LlamaOracle]:
    return Tokenizer.from_gguf(any_real_model), LlamaOracle(any_real_model)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus()


def _check_encode(tok: Tokenizer, oracle: LlamaOracle, strings: list[str]) -> list[tuple]:
    bad = []
    for s in strings:
        for add, parse in FLAGS:
            ours, ref = tok.encode(s, add_special=add, parse_special=parse), oracle.tokenize(s, add, parse)
            if ours != ref:
                bad.append((s, add, parse, ours[:20], ref[:20]))
    return bad


def _check_decode(tok: Tokenizer, oracle: LlamaOracle, ids: list[int]) -> list[tuple]:
    bad = []
    for special in (False, True):
        ref = oracle.detokenize(ids, special)
        whole = tok.decode_bytes(ids, skip_special=not special)
        detok = tok.detokenizer(skip_special=not special)
        streamed = "".join([detok.add(i) for i in ids]) + detok.flush()
        if whole != ref or streamed != ref.decode("utf-8", "replace"):
            bad.append((ids[:20], special, whole[:60], ref[:60], streamed[:60]))
    return bad


def test_corpus_is_big_and_varied(texts: list[str]) -> None:
    assert len(texts) >= 2000
    assert "" in texts and any(len(s) > 5000 for s in texts)


def test_corpus_encode_matches_llama(pair: tuple[Tokenizer, LlamaOracle], texts: list[str]) -> None:
    tok, oracle = pair
    bad = _check_encode(tok, oracle, texts)
    assert not bad, f"{len(bad)} of {4 * len(texts)} encodings differ, first: {bad[:3]}"


def test_corpus_decode_matches_llama(pair: tuple[Tokenizer, LlamaOracle], texts: list[str]) -> None:
    tok, oracle = pair
    bad = []
    for s in texts:
        bad += _check_decode(tok, oracle, oracle.tokenize(s, True, True))
    assert not bad, f"{len(bad)} decodings differ, first: {bad[:3]}"


def test_corpus_roundtrip_where_llama_roundtrips(
    pair: tuple[Tokenizer, LlamaOracle], texts: list[str]
) -> None:
    tok, oracle = pair
    llama_ok = ours_bad = 0
    for s in texts:
        if oracle.detokenize(oracle.tokenize(s, False, False), False) == s.encode():
            llama_ok += 1
            if tok.decode(tok.encode(s, add_special=False)) != s:
                ours_bad += 1
    assert llama_ok > 0.9 * len(texts)
    assert ours_bad == 0


ASSIGNED = st.characters(exclude_categories=("Cn", "Cs"))  # assigned in Python's unicodedata
TRICKY = st.sampled_from(
    list(" \t\n\r\x0b\x0c\u00a0\u3000\u2028\x85'sStTrReEvVmMlLdD0123456789<|>_.,!?\u0301")
)
BIASED = st.lists(st.one_of(ASSIGNED, TRICKY, st.sampled_from(SPECIAL_TEXTS)), max_size=40).map("".join)
HYP = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@HYP
@given(text=st.text(ASSIGNED, max_size=60))
def test_random_text_matches_llama(pair: tuple[Tokenizer, LlamaOracle], text: str) -> None:
    tok, oracle = pair
    assert not _check_encode(tok, oracle, [text])
    assert not _check_decode(tok, oracle, oracle.tokenize(text, True, True))


@HYP
@given(text=BIASED)
def test_random_tricky_text_matches_llama(pair: tuple[Tokenizer, LlamaOracle], text: str) -> None:
    tok, oracle = pair
    assert not _check_encode(tok, oracle, [text])
    assert not _check_decode(tok, oracle, oracle.tokenize(text, True, True))


def test_stop_ids_are_llama_eog(pair: tuple[Tokenizer, LlamaOracle]) -> None:
    tok, oracle = pair
    eog = {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(oracle.vocab, i)}
    assert tok.stop_ids == eog
    assert tok.eos_id in tok.stop_ids
    assert tok.bos_id == llama_cpp.llama_vocab_bos(oracle.vocab)
    assert tok.eos_id == llama_cpp.llama_vocab_eos(oracle.vocab)
    assert tok.vocab_size == llama_cpp.llama_vocab_n_tokens(oracle.vocab)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(oracle.vocab)


def test_attributes_and_pieces_match_llama(pair: tuple[Tokenizer, LlamaOracle]) -> None:
    tok, oracle = pair
    attr = llama_cpp.llama_vocab_get_attr
    diff_attr = [i for i in range(tok.vocab_size) if tok.token_attr(i) != attr(oracle.vocab, i)]
    assert not diff_attr[:10]
    # Every non-normal token and a spread of normal ones (all of them would take seconds).
    step = max(1, tok.vocab_size // 20000)
    ids = [*range(0, tok.vocab_size, step), *(i for i in range(tok.vocab_size) if tok.token_attr(i) != 4)]
    for special in (True, False):
        diff = [i for i in ids if tok.token_to_piece(i, special) != oracle.piece(i, special)]
        assert not diff, [(i, tok.token_to_piece(i, special), oracle.piece(i, special)) for i in diff[:5]]


# -- other pre-tokenizers and flags: the real vocabularies with edited metadata ------------------
VARIANTS = {
    "smollm-as-gpt2": ("smollm2-135m", {"tokenizer.ggml.pre": "gpt-2"}),
    "smollm-as-llama3": (
        "smollm2-135m",
        {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": None},
    ),
    "smollm-as-default": ("smollm2-135m", {"tokenizer.ggml.pre": "default"}),
    "smollm-as-qwen2": ("smollm2-135m", {"tokenizer.ggml.pre": "qwen2"}),
    # what Phi-4, OLMo 2 and the 100k-vocabulary Granite files declare, and Granite 3.0/3.1
    "smollm-as-dbrx": ("smollm2-135m", {"tokenizer.ggml.pre": "dbrx"}),
    "smollm-as-refact": ("smollm2-135m", {"tokenizer.ggml.pre": "refact"}),
    "gemma-with-space-prefix": ("gemma3-270m", {"tokenizer.ggml.add_space_prefix": True}),
}


def _write_vocab_only(src: Path, dst: Path, overrides: dict[str, object]) -> None:
    from gguf import GGUFValueType, GGUFWriter

    from edge_infer.formats.gguf import GGUFFile

    with GGUFFile(src) as f:
        w = GGUFWriter(str(dst), f.metadata["general.architecture"])
        for key, value in f.metadata.items():
            if key == "general.architecture" or (key in overrides and overrides[key] is None):
                continue
            value, vtype = overrides.get(key, value), f.metadata_types[key]
            if vtype.startswith("array["):
                w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=GGUFValueType[vtype[6:-1].upper()])
            else:
                w.add_key_value(key, value, GGUFValueType[vtype.upper()])
        for key, value in overrides.items():
            if key not in f.metadata and value is not None:
                w.add_key_value(
                    key, value, GGUFValueType.BOOL if isinstance(value, bool) else GGUFValueType.STRING
                )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Tokenizer, LlamaOracle]:
    name, overrides = VARIANTS[request.param]
    src = request.getfixturevalue({"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path"}[name])
    dst = tmp_path_factory.mktemp("vocab") / f"{request.param}.gguf"
    _write_vocab_only(src, dst, overrides)
    return Tokenizer.from_gguf(dst), LlamaOracle(dst)


def test_variant_vocabularies_match_llama(variant: tuple[Tokenizer, LlamaOracle], texts: list[str]) -> None:
    tok, oracle = variant
    sample = texts[::3]
    bad = _check_encode(tok, oracle, sample)
    assert not bad, f"{len(bad)} encodings differ, first: {bad[:3]}"
    for s in sample:
        assert not _check_decode(tok, oracle, oracle.tokenize(s, True, True)), s


def test_long_indented_code_matches_llama(pair: tuple[Tokenizer, LlamaOracle]) -> None:
    # Long texts full of whitespace runs take the vectorised special-token path (gemma's
    # vocabulary has user-defined tokens for runs of spaces, tabs and newlines).
    import argparse
    import inspect
    import textwrap

    tok, oracle = pair
    source = (inspect.getsource(textwrap) + inspect.getsource(argparse))[:40_000]
    for text in (source, source.replace("    ", "\t"), source.replace("\n", "\r\n\n")):
        for add, parse in FLAGS:
            assert tok.encode(text, add_special=add, parse_special=parse) == oracle.tokenize(text, add, parse)
        ids = oracle.tokenize(text, True, True)
        assert not _check_decode(tok, oracle, ids)
