"""/v1/rerank (and its aliases /rerank, /v1/reranking) and /v1/embeddings on encoder models:
tiny random-weight berts, one pooling mean (ranked by embedding cosine) and one reranker
(pooling rank: its classification head scores each pair). Scores and vectors equal LLM.rerank's
and LLM.embed's; bad requests are 400s naming the field; an encoder refuses chat and
completions with a 400 naming it an encoder. A real MiniLM puts the relevant documents first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from bert_models import EncoderSpec, write_encoder

from edge_infer import LLM

openai = pytest.importorskip("openai")

KEY = "sk-test-rerank"
MODEL = "tiny-bert"
HEADERS = {"Authorization": f"Bearer {KEY}"}
TEXTS = ["the cat sat on the mat", "hello world", "what is the capital of france"]
QUERY = "the cat sat"
DOCS = ["hello world", "the cat sat on the mat", "a dog runs", "paris is the capital of france"]
ROUTES = ("/v1/rerank", "/rerank", "/v1/reranking")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("encoders")
    return {"cosine": write_encoder(d, EncoderSpec(pooling="mean")),
            "rank": write_encoder(d, EncoderSpec(pooling="rank", rank_head=True))}


@pytest.fixture(scope="module")
def offline(models: dict[str, Path]) -> dict[str, Any]:
    """What the offline API gives for the same files: embeddings and rerank scores."""
    out: dict[str, Any] = {}
    with LLM(str(models["cosine"]), n_threads=1) as llm:
        out["embed"] = llm.embed(TEXTS)
        out["cosine"] = llm.rerank(QUERY, DOCS)
    with LLM(str(models["rank"]), n_threads=1) as llm:
        out["rank"] = llm.rerank(QUERY, DOCS)
    return out


@pytest.fixture(scope="module")
def servers(start_server, models: dict[str, Path]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    flags = ("-t", "1", "--api-key", KEY, "--served-model-name", MODEL, "--max-inputs", "8")
    return {kind: start_server(path, *flags) for kind, path in models.items()}


def post(srv: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=HEADERS, timeout=60)


def test_openai_embeddings_on_an_encoder(servers, offline) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=servers["cosine"].url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    r = client.embeddings.create(model=MODEL, input=TEXTS)
    got = np.array([d.embedding for d in r.data], np.float32)
    assert got.shape == (len(TEXTS), 64) and [d.index for d in r.data] == [0, 1, 2]
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(got, offline["embed"])
    assert r.usage.prompt_tokens > len(TEXTS) * 2  # [CLS] ... [SEP] each


@pytest.mark.parametrize("route", ROUTES)
def test_cosine_rerank_sorted_and_equal_to_llm(servers, offline, route) -> None:  # type: ignore[no-untyped-def]
    r = post(servers["cosine"], route, {"model": MODEL, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == MODEL and body["object"] == "list" and body["scoring"] == "cosine"
    results = body["results"]
    assert sorted(x["index"] for x in results) == list(range(len(DOCS)))
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    for x in results:  # each score is the one LLM.rerank gives its document (by index)
        assert x["relevance_score"] == pytest.approx(offline["cosine"][x["index"]], abs=1e-6)
        assert "document" not in x  # only when asked (llama.cpp never sends it)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(DOCS) + 1


def test_rank_model_top_n_and_documents(servers, offline) -> None:  # type: ignore[no-untyped-def]
    docs = [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]]  # Jina's / Cohere's objects mix with strings
    r = post(servers["rank"], "/v1/rerank", {"query": QUERY, "documents": docs, "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scoring"] == "rank" and len(body["results"]) == 2
    want = sorted(range(len(DOCS)), key=lambda i: offline["rank"][i], reverse=True)[:2]
    assert [x["index"] for x in body["results"]] == want
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(offline["rank"][x["index"]], abs=1e-6)
        assert x["document"] == {"text": DOCS[x["index"]]}
    # top_n past the count: all of them
    r = post(servers["rank"], "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 99, "return_documents": False})
    assert len(r.json()["results"]) == len(DOCS) and "document" not in r.json()["results"][0]


LONG = " ".join(["the cat"] * 40)  # ~80 tokens, past the tiny model's 64


@pytest.mark.parametrize(("body", "param"), [
    ({"documents": DOCS}, "query"),
    ({"query": "", "documents": DOCS}, "query"),
    ({"query": 5, "documents": DOCS}, "query"),
    ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": "a document"}, "documents"),
    ({"query": QUERY, "documents": ["a", 7]}, "documents"),
    ({"query": QUERY, "documents": ["a", ""]}, "documents"),
    ({"query": QUERY, "documents": [{"txt": "a"}]}, "documents"),
    ({"query": QUERY, "documents": [{"text": "a", "title": "b"}]}, "documents"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": -2}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": "2"}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "top_n": 1.5}, "top_n"),
    ({"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents"),
    ({"query": QUERY, "documents": DOCS, "rank_fields": ["text"]}, "rank_fields"),
    ({"query": QUERY, "documents": ["a"] * 9}, "documents"),
    ({"query": QUERY, "documents": ["a", LONG]}, "documents"),
    ({"query": LONG, "documents": ["a"]}, "query"),
], ids=["no-query", "empty-query", "int-query", "no-documents", "empty-documents", "string-documents",
        "int-document", "empty-document", "object-without-text", "object-extra-field", "top-n-zero",
        "top-n-negative", "top-n-string", "top-n-float", "return-documents-string", "unknown-field",
        "over-max-inputs", "long-document", "long-query"])
def test_bad_rerank_requests_are_400(servers, body, param) -> None:  # type: ignore[no-untyped-def]
    r = post(servers["cosine"], "/v1/rerank", {"model": MODEL, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_too_long_pair_on_a_reranker_is_400(servers) -> None:  # type: ignore[no-untyped-def]
    doc = " ".join(["the cat"] * 30)  # 62 tokens alone: fits; 66 with the query: does not
    assert post(servers["cosine"], "/v1/rerank", {"query": QUERY, "documents": [doc]}).status_code == 200
    r = post(servers["rank"], "/v1/rerank", {"query": QUERY, "documents": ["a", doc]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "documents" and "documents[1]" in err["message"], r.text
    r = post(servers["rank"], "/v1/rerank", {"model": "other", "query": QUERY, "documents": ["a"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/v1/completions", {"prompt": "the cat"}),
    ("/v1/completions", {"prompt": "the cat", "stream": True}),
], ids=["chat", "chat-stream", "completions", "completions-stream"])
def test_generation_on_an_encoder_is_400(servers, route, body) -> None:  # type: ignore[no-untyped-def]
    for srv in servers.values():
        r = post(srv, route, {"model": MODEL, **body})
        assert r.status_code == 400 and "is an encoder" in r.json()["error"]["message"], r.text


MINILM = "all-minilm-l6-v2"
LABELLED = [  # (query, documents, the relevant one's index)
    ("What is the capital of France?",
     ["Bananas are yellow and rich in potassium.", "Paris is the capital of France.",
      "The stock market fell sharply on Monday.", "Cats sleep for most of the day."], 1),
    ("How do I bake bread at home?",
     ["The football match ended in a draw.", "Jupiter is the largest planet in the solar system.",
      "Mix flour, water, yeast and salt, let the dough rise, then bake it in a hot oven.",
      "She bought a new pair of running shoes."], 2),
    ("Which animal is known as man's best friend?",
     ["Dogs are loyal companions and are often called man's best friend.", "Python is a programming language.",
      "The Eiffel Tower is in Paris.", "Rain is expected tomorrow afternoon."], 0),
]


@pytest.mark.slow
def test_minilm_puts_relevant_documents_first(start_server) -> None:  # type: ignore[no-untyped-def]
    from edge_infer import hub
    from edge_infer.hub.registry import KNOWN_MODELS

    if MINILM not in KNOWN_MODELS:
        pytest.skip(f"{MINILM} is not in edge_infer.hub.registry.KNOWN_MODELS yet")
    srv = start_server(hub.resolve_model(MINILM), "-t", "2")
    for query, docs, relevant in LABELLED:
        r = httpx.post(srv.url + "/v1/rerank", json={"query": query, "documents": docs}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["scoring"] == "cosine"
        assert r.json()["results"][0]["index"] == relevant, (query, r.json())
