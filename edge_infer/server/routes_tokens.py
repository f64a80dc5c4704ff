"""The routes over the model's inputs rather than its generations: POST /v1/embeddings
(embeddings.py), /v1/rerank with llama.cpp's aliases /rerank and /v1/reranking (rerank.py),
/tokenize (a prompt, or messages under the chat template, to token ids) and /detokenize
(token ids to text)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from edge_infer.errors import EdgeInferError
from edge_infer.server.context import parse_request
from edge_infer.server.embeddings import create_embeddings
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.protocol import DetokenizeRequest, EmbeddingRequest, TokenizeRequest, template_messages
from edge_infer.server.rerank import RerankRequest, create_rerank
from edge_infer.server.schema import body_schema

router = APIRouter()


@router.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    ctx, req = await parse_request(request, EmbeddingRequest)
    async with ctx.pool.use(req.model, req.keep_alive, adapters=False) as (engine, model):
        return JSONResponse(await create_embeddings(req, engine, model))


@router.post("/v1/rerank", openapi_extra=body_schema(RerankRequest))
@router.post("/rerank", openapi_extra=body_schema(RerankRequest))
@router.post("/v1/reranking", openapi_extra=body_schema(RerankRequest))
async def rerank(request: Request) -> Response:
    ctx, req = await parse_request(request, RerankRequest)
    async with ctx.pool.use(req.model, adapters=False) as (engine, model):
        return JSONResponse(await create_rerank(req, engine, model))


@router.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
async def tokenize(request: Request) -> Response:
    ctx, req = await parse_request(request, TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give either prompt or messages", param="prompt", code="invalid_value")
    async with ctx.pool.use(req.model) as (engine, _):
        return await _tokenize(req, engine)


async def _tokenize(req: TokenizeRequest, engine: AsyncEngine) -> Response:
    tok = engine.tokenizer
    assert tok is not None
    if req.prompt is not None:
        text, special = req.prompt, req.add_special_tokens is not False
        ids = await engine.run(lambda: tok.encode(text, add_special=special, parse_special=False))
    else:
        msgs = template_messages(req.messages or [])
        ids = await engine.chat_prompt(msgs, add_generation_prompt=req.add_generation_prompt is not False)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len})


@router.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
async def detokenize(request: Request) -> Response:
    ctx, req = await parse_request(request, DetokenizeRequest)
    async with ctx.pool.use(req.model) as (engine, _):
        return await _detokenize(req, engine)


async def _detokenize(req: DetokenizeRequest, engine: AsyncEngine) -> Response:
    tok = engine.tokenizer
    assert tok is not None
    bad = [t for t in req.tokens if not 0 <= t < tok.vocab_size]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{tok.vocab_size - 1})",
                       param="tokens", code="invalid_value")
    try:
        text = await engine.run(lambda: tok.decode(req.tokens))
    except EdgeInferError as e:
        raise from_engine_error(e) from None
    return JSONResponse({"prompt": text})
