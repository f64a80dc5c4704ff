"""The generating routes: POST /v1/completions, /v1/chat/completions and /v1/responses
(completions.py, chat.py and responses.py build the answers; this module checks the request, names the model and refuses an
encoder's, which computes embeddings and rerank scores but no text; routes_lora.py picks the LoRA adapters from `model` and `lora`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from edge_infer.server.chat import create_chat_completion
from edge_infer.server.completions import create_completion
from edge_infer.server.context import parse_request
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError
from edge_infer.server.protocol import ChatCompletionRequest, CompletionRequest
from edge_infer.server.responses import create_response
from edge_infer.server.responses_protocol import ResponsesRequest
from edge_infer.server.routes_lora import model_lora, request_lora
from edge_infer.server.schema import body_schema

router = APIRouter()


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(request: Request) -> Response:
    ctx, req = await parse_request(request, CompletionRequest)
    async with ctx.pool.use(req.model, req.keep_alive) as (engine, model):
        refuse_encoder(engine)
        lora = await request_lora(engine, ctx.pool, model, req.lora)
        return await create_completion(req, engine, model, request.receive, lora)


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    ctx, req = await parse_request(request, ChatCompletionRequest)
    async with ctx.pool.use(req.model, req.keep_alive) as (engine, model):
        refuse_encoder(engine)
        lora = await request_lora(engine, ctx.pool, model, req.lora)
        return await create_chat_completion(req, engine, model, request.receive, lora)


@router.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
async def responses(request: Request) -> Response:
    ctx, req = await parse_request(request, ResponsesRequest)
    async with ctx.pool.use(req.model, req.keep_alive) as (engine, model):
        refuse_encoder(engine)
        return await create_response(req, engine, model, request.receive, model_lora(ctx.pool, model))


def refuse_encoder(engine: AsyncEngine) -> None:
    """A 400 naming the reason for an encoder model, before any templating or tokenizing (its
    engine would refuse the request too, but chat would first fail on the missing template)."""
    worker = engine.worker
    eng = worker.engine if worker is not None else None
    if eng is None:  # a cluster's replicas refuse it themselves
        return
    from edge_infer.engine.encoder_engine import EncoderEngine  # loaded already: make_engine chose by it

    if isinstance(eng, EncoderEngine):
        raise APIError(400, f"this model ({eng.model_config.arch}) is an encoder: it computes embeddings and rerank "
                       "scores (/v1/embeddings, /v1/rerank), it does not generate text", param="model",
                       code="model_not_generative")
