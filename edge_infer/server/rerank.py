"""POST /v1/rerank (also /rerank and /v1/reranking, llama.cpp's names): documents ranked by
relevance to a query, in llama.cpp's and Jina's shape.

A reranker (an encoder whose pooling_type is rank: a cross-encoder) scores each (query,
document) pair with its classification head; any other model ranks by the cosine of the
query's and each document's embeddings, as LLM.rerank does. The answer's `scoring` says which
("rank" or "cosine"): the scales differ (a head's logit is unbounded, a cosine lies in
[-1, 1]), so a client comparing scores or setting a threshold needs to know. A result carries
its `document` only with return_documents: true (llama.cpp never sends it; Jina's field and
shape). The request model lives here, beside its one route, rather than in protocol.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import WithJsonSchema

from edge_infer.engine.embedding import cosine_scores
from edge_infer.errors import EdgeInferError
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.protocol import _Strict

if TYPE_CHECKING:
    from edge_infer.engine.engines import Engine

FIELDS = {"query", "documents"}
DOCUMENT_SCHEMA = {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "object", "properties": {"text": {"type": "string", "minLength": 1}}, "required": ["text"],
     "additionalProperties": False}]}}


class RerankRequest(_Strict):
    model: str | None = None
    query: str
    # checked by checked(): pydantic's union errors would name the string branch only
    documents: Annotated[Any, WithJsonSchema(DOCUMENT_SCHEMA)]
    top_n: int | None = None
    return_documents: bool | None = False

    def checked(self) -> tuple[str, list[str], int]:
        """(query, document texts, top_n); an empty query, a document that is neither a
        non-empty string nor {"text": non-empty string}, or a top_n below 1 is a 400 naming it."""
        if not self.query:
            raise APIError(400, "query must be a non-empty string", param="query", code="invalid_value")
        docs = self.documents
        if not isinstance(docs, list) or not docs:
            raise APIError(400, "documents must be a non-empty list of strings (or of {\"text\": string} objects), "
                           f"got {_kind(docs)}", param="documents", code="invalid_type")
        texts = []
        for i, d in enumerate(docs):
            text = d.get("text") if isinstance(d, dict) and set(d) == {"text"} else d
            if not isinstance(text, str) or not text:
                raise APIError(400, f"documents[{i}] must be a non-empty string or an object {{\"text\": string}} "
                               f"(nothing else), got {_kind(d)}", param="documents", code="invalid_value")
            texts.append(text)
        if self.top_n is not None and self.top_n < 1:
            raise APIError(400, f"top_n must be a positive integer, got {self.top_n}", param="top_n",
                           code="invalid_value")
        return self.query, texts, self.top_n or len(texts)


async def create_rerank(req: RerankRequest, engine: AsyncEngine, model: str) -> dict[str, Any]:
    query, docs, top_n = req.checked()
    worker = engine.worker
    if worker is None or worker.engine is None:
        raise APIError(503, "the engine is not running", code="shutting_down")
    eng = worker.engine
    # Imported here, where an engine runs in this process (make_engine loaded it to choose): the
    # module pulls in the models, which a cluster's ingress never needs.
    from edge_infer.engine.encoder_engine import EncoderEngine

    try:
        if isinstance(eng, EncoderEngine) and eng.rerank_method == "rank":
            scoring = "rank"
            ids = await engine.run(lambda: [_tokens(f"documents[{i}] (with the query)", "documents", eng.rerank_ids,
                                                    query, d) for i, d in enumerate(docs)])

            def score(e: Engine) -> np.ndarray:
                assert isinstance(e, EncoderEngine)
                return e.score_pairs(ids)

            scores = await engine.call(score)
        else:  # no rank head: the cosine of embeddings (a decoder's too)
            scoring = "cosine"
            ids = await engine.run(lambda: [_tokens("query", "query", eng.embed_ids, query)]
                                   + [_tokens(f"documents[{i}]", "documents", eng.embed_ids, d)
                                      for i, d in enumerate(docs)])
            scores = cosine_scores(await engine.call(lambda e: e.embed(ids)))
    except EdgeInferError as e:
        raise from_engine_error(e, FIELDS) from None
    # sorted is stable: equal scores keep the documents' order
    order = sorted(range(len(docs)), key=lambda i: float(scores[i]), reverse=True)[:top_n]
    results = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            item["document"] = {"text": docs[i]}
        results.append(item)
    n = sum(len(t) for t in ids)
    return {"model": model, "object": "list", "scoring": scoring, "results": results,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def _tokens(where: str, param: str, fn: Callable[..., list[int]], *texts: str) -> list[int]:
    """fn(*texts)'s token ids; its refusal (too long, no tokens) a 400 that says which input."""
    try:
        return fn(*texts)
    except EdgeInferError as e:
        err = from_engine_error(e, FIELDS)
        if err.status != 400:
            raise
        raise APIError(400, f"{where}: {err.message}", param=param, code=err.code) from None


def _kind(v: object) -> str:
    """What a bad document was, briefly: its JSON value when short, else its type."""
    if isinstance(v, (str, int, float, bool, type(None))) and len(repr(v)) <= 40:
        return json.dumps(v)
    if isinstance(v, dict):
        return f"an object with keys {sorted(v)[:4]}"
    return type(v).__name__
