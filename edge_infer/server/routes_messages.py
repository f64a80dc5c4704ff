"""Anthropic's Messages API routes: POST /v1/messages and /v1/messages/count_tokens (messages.py
answers them). The API key may come as `x-api-key` (Anthropic's clients) or as a Bearer token;
`anthropic-version` and `anthropic-beta` headers are accepted whatever their value. Every error
on these paths is in Anthropic's shape (app.py picks it by path)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from edge_infer.server.anthropic_protocol import CountTokensRequest, MessagesRequest
from edge_infer.server.context import parse_request
from edge_infer.server.messages import count_tokens, create_message
from edge_infer.server.routes_generate import refuse_encoder
from edge_infer.server.routes_lora import model_lora
from edge_infer.server.schema import body_schema

router = APIRouter()
PREFIX = "/v1/messages"


@router.post("/v1/messages", openapi_extra=body_schema(MessagesRequest))
async def messages(request: Request) -> Response:
    ctx, req = await parse_request(request, MessagesRequest, x_api_key=True)
    async with ctx.pool.use(req.model, req.keep_alive) as (engine, model):
        refuse_encoder(engine)
        return await create_message(req, engine, model, request.receive, model_lora(ctx.pool, model))


@router.post("/v1/messages/count_tokens", openapi_extra=body_schema(CountTokensRequest))
async def messages_count_tokens(request: Request) -> Response:
    ctx, req = await parse_request(request, CountTokensRequest, x_api_key=True)
    async with ctx.pool.use(req.model) as (engine, _):
        refuse_encoder(engine)
        return JSONResponse(await count_tokens(req, engine))
