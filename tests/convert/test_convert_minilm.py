"""The real all-MiniLM-L6-v2 (the known model `all-minilm-l6-v2`, pulled once into the cache with
its Hugging Face zip kept beside it): converting it again gives the same bytes as the pull did,
and llama.cpp's embeddings of the converted file are those of a NumPy forward over the zip's
safetensors, its tokens those of the model's tokenizer.json."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from bert_reference import BertReference, cosine
from llama_bert import LlamaBert

from edge_infer import hub
from edge_infer.convert import convert_hf
from edge_infer.hub.cache import source_path

pytestmark = pytest.mark.slow
NAME = "all-minilm-l6-v2"
SENTENCES = (
    "A man is playing a guitar.",
    "The new movie is awesome!",
    "Hello World! This is a test.",
    "I love pizza, pasta and gelato; Italian food is the BEST.",
    "Café naïve résumé: accents are stripped by the uncased tokenizer.",
    "How many people live in Berlin? About 3.7 million (2023).",
    "The quick brown fox jumps over the lazy dog.",
    "Transformers produce contextual embeddings for every token in a sentence.",
    "Tokyo 東京 is the capital of Japan.",
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
)


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the GGUF `edge-infer pull` converted, the zip's folder unpacked under the same name)."""
    gguf_path = hub.pull(NAME, progress=False)
    if not source_path(NAME).exists():  # cached by an older pull: fetch the zip and convert again
        from edge_infer.hub.converted import pull_converted

        pull_converted(hub.KNOWN_MODELS[NAME], gguf_path, False)
    folder = tmp_path_factory.mktemp("hf") / NAME
    with zipfile.ZipFile(source_path(NAME)) as z:
        z.extractall(folder)
    return gguf_path, folder


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_conversion_is_deterministic(pulled: tuple[Path, Path], tmp_path: Path) -> None:
    gguf_path, folder = pulled
    again = convert_hf(folder, tmp_path / "again.gguf")
    assert sha256(again) == sha256(gguf_path)
    assert hub.resolve_model(NAME, download=False) == gguf_path and gguf_path.suffix == ".gguf"


def test_llama_cpp_embeds_as_the_reference(pulled: tuple[Path, Path]) -> None:
    from tokenizers import Tokenizer

    gguf_path, folder = pulled
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    llm = LlamaBert(gguf_path)
    try:  # llama.cpp first, the reference after: their thread pools spin-wait on each other's cores
        got = {s: (llm.tokens(s), llm.embed(s)) for s in SENTENCES}
    finally:
        llm.close()
    ref = BertReference(folder)
    for s, (tokens, emb) in got.items():
        ids = tok.encode(s).ids
        assert tokens == ids, s
        assert cosine(emb, ref.embed(ids)) >= 0.999, s  # about 1 - 2e-7
        assert cosine(emb, ref.embed(ids, gelu="erf")) >= 0.999, s  # about 1 - 1e-6


def test_edge_infer_embeds_as_llama_cpp_and_the_reference(pulled: tuple[Path, Path]) -> None:
    """Our engine on the converted file: the same tokens as llama.cpp, embeddings at cosine >=
    0.999 of llama.cpp's and of the NumPy forward (about 1 - 1e-7), batched and alone alike."""
    import numpy as np

    from edge_infer import LLM

    gguf_path, folder = pulled
    llm = LlamaBert(gguf_path)
    try:
        theirs = {s: (llm.tokens(s), llm.embed(s)) for s in SENTENCES}
    finally:
        llm.close()
    ref = BertReference(folder)
    with LLM(str(gguf_path)) as ours:
        batched = ours.embed(list(SENTENCES))
        for i, s in enumerate(SENTENCES):
            tokens, emb = theirs[s]
            assert ours.tokenizer.encode(s, add_special=True) == tokens, s
            assert cosine(batched[i], emb) >= 0.999, s
            assert cosine(batched[i], ref.embed(tokens)) >= 0.999, s
            np.testing.assert_array_equal(ours.embed(s)[0], batched[i], err_msg=s)
