"""The routes about the server rather than a model call: GET /health (503 until the model is
loaded and while draining, open without an API key), /v1/models and /v1/models/{model} (the
served model's card), /metrics (Prometheus text, open without an API key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from edge_infer.server.context import ServerContext, server_context
from edge_infer.server.errors import APIError
from edge_infer.server.http_guards import authorize

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    engine = server_context(request.app).engine
    if engine.state == "ready":
        return JSONResponse({"status": "ok"})
    try:
        engine.check_ready()
    except APIError as e:
        return JSONResponse(e.body(), status_code=503, headers=e.headers)
    return JSONResponse({"status": "ok"})  # pragma: no cover


@router.get("/v1/models")
async def models(request: Request) -> Response:
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys)
    return JSONResponse({"object": "list", "data": [_model_card(ctx, ctx.model_name)]})


@router.get("/v1/models/{model:path}")
async def model(request: Request, model: str) -> Response:
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys)
    return JSONResponse(_model_card(ctx, ctx.check_model(model)))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    engine = server_context(request.app).engine
    snapshot = None
    if engine.state in ("ready", "draining") and engine.worker is not None:
        snapshot = await engine.call(lambda e: e.metrics())
    text = engine.metrics.render(snapshot, ready=engine.state == "ready", in_flight=len(engine.in_flight))
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def _model_card(ctx: ServerContext, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": ctx.created, "owned_by": "edge-infer",
            "max_model_len": ctx.engine.max_model_len or None}
