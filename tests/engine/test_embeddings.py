"""LLM.embed on the real SmolLM2: the model's width, unit norm, paraphrases closer than
unrelated texts; the same vectors batched or alone and whatever the step size; last-token and
mean pooling against llama.cpp's embeddings of the same file; a pooling with no single vector
is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from llama_oracle import LlamaCpp

from edge_infer import LLM
from edge_infer.errors import InvalidRequest
from edge_infer.models import llama

PAIRS = [("The cat sat on the mat.", "A cat was sitting on the rug."),
         ("How do I reverse a list in Python?", "What is the way to reverse a Python list?"),
         ("The stock market fell sharply today.", "Share prices dropped steeply this afternoon.")]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):  # type: ignore[no-untyped-def]
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="32MiB") as m:
        yield m


def test_width_norm_and_paraphrases(llm: LLM) -> None:
    texts = [t for pair in PAIRS for t in pair]
    e = llm.embed(texts)
    assert e.shape == (6, llm.model_config.d_model) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-5)
    sim = e @ e.T
    for i in range(3):
        para = sim[2 * i, 2 * i + 1]
        others = [sim[2 * i, 2 * j + k] for j in range(3) if j != i for k in (0, 1)]
        assert para > max(others), (i, para, others)


def test_batched_alone_and_chunked_agree(smollm2_path: Path, llm: LLM) -> None:
    texts = ["short", "a longer text that spans several prefill steps when the budget is small " * 3, "mid size text"]
    together = llm.embed(texts)
    alone = np.stack([llm.embed(t)[0] for t in texts])
    np.testing.assert_array_equal(together, alone)
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="32MiB", max_num_batched_tokens=16) as small:
        np.testing.assert_array_equal(small.embed(texts), together)


@pytest.mark.parametrize(("pooling", "code"), [("last", 3), ("mean", 1)])
def test_matches_llama_cpp(smollm2_path: Path, pooling: str, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    real = llama.config_from_gguf
    monkeypatch.setattr(llama, "config_from_gguf", lambda f, *a, **k: dataclasses.replace(real(f, *a, **k), pooling=pooling))
    texts = [t for pair in PAIRS for t in pair]
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="32MiB") as m:
        ours = m.embed(texts)
        ids = [m.tokenizer.encode(t) for t in texts]
    ref = LlamaCpp(smollm2_path, 64, pooling=code)
    try:
        theirs = np.stack([ref.embedding(i) for i in ids])
    finally:
        ref.close()
    theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
    cos = np.sum(ours * theirs, axis=1)
    assert cos.min() > 0.999, cos


def test_pooling_without_one_vector_is_refused(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = llama.config_from_gguf
    monkeypatch.setattr(llama, "config_from_gguf", lambda f, *a, **k: dataclasses.replace(real(f, *a, **k), pooling="none"))
    with LLM(str(smollm2_path), n_threads=1, kv_cache_memory="8MiB") as m, pytest.raises(InvalidRequest, match="pooling_type is 'none'"):
        m.embed("hello")
    with LLM(str(smollm2_path), n_threads=1, kv_cache_memory="8MiB") as m, pytest.raises(InvalidRequest, match="at least one"):
        m.embed([])
