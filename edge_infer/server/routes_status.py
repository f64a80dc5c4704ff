"""The routes about the server rather than a model call: GET /health (503 until the model is
loaded and while draining, open without an API key; a server of several models is healthy
once its first model has loaded, and says which are loaded now), /v1/models and /v1/models/{model} (the served
models' cards, and each LoRA adapter's with its model as `parent`, as vLLM lists them), /metrics (Prometheus text, open without an API key)."""

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
    ctx = server_context(request.app)
    try:
        ctx.check_serving()
        if ctx.engine.state == "loading":  # start-up: the first model is not loaded yet
            ctx.engine.check_ready()
    except APIError as e:
        return JSONResponse(e.body(), status_code=503, headers=e.headers)
    if len(ctx.pool.models) == 1:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "ok", "loaded": [n for n in ctx.pool.engines if ctx.pool.loaded(n) is not None]})


@router.get("/v1/models")
async def models(request: Request) -> Response:
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys)
    cards = [_model_card(ctx, name) for m in ctx.pool.models for name in (m.name, *m.adapters)]
    return JSONResponse({"object": "list", "data": cards})


@router.get("/v1/models/{model:path}")
async def model(request: Request, model: str) -> Response:
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys)
    return JSONResponse(_model_card(ctx, ctx.pool.adapter(model) or ctx.pool.resolve(model).name))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    pool = server_context(request.app).pool
    engine = pool.any_engine()
    snapshot = None
    if engine is not None and engine.state in ("ready", "draining") and engine.worker is not None:
        snapshot = await engine.call(lambda e: e.metrics())
    in_flight = sum(len(e.in_flight) for e in pool.engines.values())
    text = pool.metrics.render(snapshot, ready=engine is not None and engine.state == "ready", in_flight=in_flight)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


def _model_card(ctx: ServerContext, name: str) -> dict[str, Any]:
    """OpenAI's model object; with several models, whether it is loaded now (llama.cpp's router
    and Ollama's /api/ps say the same). A LoRA adapter's (`name` an adapter's) has its model as
    `parent` (vLLM's field) and the rest as its model's."""
    served = next((m for m in ctx.pool.models if m.name == name), None) or ctx.pool.resolve(name)
    engine = ctx.pool.loaded(served.name)
    card = {"id": name, "object": "model", "created": ctx.created, "owned_by": "edge-infer",
            "max_model_len": engine.max_model_len or None if engine is not None else None}
    if name != served.name:
        card["parent"] = served.name
    if len(ctx.pool.models) > 1:
        card["status"] = "loaded" if engine is not None else "unloaded"
    card["input_modalities"] = ["text", "image"] if served.config.mmproj else ["text"]  # images with an mmproj
    return card
