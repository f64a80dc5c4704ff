"""The generating routes: POST /v1/completions and /v1/chat/completions (completions.py and
chat.py build the answers; this module checks the request and names the model)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from edge_infer.server.chat import create_chat_completion
from edge_infer.server.completions import create_completion
from edge_infer.server.context import parse_request
from edge_infer.server.protocol import ChatCompletionRequest, CompletionRequest
from edge_infer.server.schema import body_schema

router = APIRouter()


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(request: Request) -> Response:
    ctx, req = await parse_request(request, CompletionRequest)
    return await create_completion(req, ctx.engine, ctx.check_model(req.model), request.receive)


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    ctx, req = await parse_request(request, ChatCompletionRequest)
    return await create_chat_completion(req, ctx.engine, ctx.check_model(req.model), request.receive)
