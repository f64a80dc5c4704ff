"""The FastAPI application: its routers, CORS, errors in OpenAI's shape, request counts.

The model loads in the background after the server starts listening: /health is 503 until
it is ready (and while shutting down), 200 after. /health and /metrics stay open when API
keys are set; everything else needs `Authorization: Bearer KEY`. Every route answers only to
the Host names of --allowed-hosts; the JSON routes take only `application/json` bodies, read
up to --max-body bytes (http_guards.py). The routes live by group in routes_generate.py
(completions, chat), routes_tokens.py (embeddings, rerank, tokenize, detokenize), routes_slots.py (saved prefixes),
routes_lora.py (LoRA adapters) and routes_status.py (health, models, metrics); each reads its app's settings and engine from context.py.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response

from edge_infer._version import __version__
from edge_infer.config import EngineConfig
from edge_infer.server import (
    routes_generate,
    routes_lora,
    routes_messages,
    routes_slots,
    routes_status,
    routes_tokens,
)
from edge_infer.server.context import ServerContext, server_context
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError, anthropic_error_body, error_body
from edge_infer.server.http_guards import LOOPBACK_NAMES, HostCheck
from edge_infer.server.limits import RequestLimits
from edge_infer.server.model_pool import ModelPool, ServedModel

log = logging.getLogger("edge_infer.server")
ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
          "/v1/messages/count_tokens",
          "/v1/embeddings", "/v1/rerank", "/rerank", "/v1/reranking", "/health", "/metrics", "/tokenize", "/detokenize",
          "/lora-adapters")


@dataclass(slots=True)
class ServerSettings:
    """What `edge-infer serve` configures. on_fatal is called if the model fails to load."""

    config: EngineConfig
    model_name: str
    aliases: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_queue: int = 256
    chat_fallback: str | None = None
    shutdown_timeout: float = 5.0
    limits: RequestLimits = field(default_factory=RequestLimits)
    read_timeout: float = 30.0  # seconds for a request body to arrive (408 after)
    write_timeout: float = 60.0  # seconds a streaming client may read nothing before it is dropped
    # Host header names answered ("*": any); `edge-infer serve` derives them from --host
    allowed_hosts: tuple[str, ...] = LOOPBACK_NAMES
    on_fatal: Callable[[str], None] | None = field(default=None, repr=False)
    # more models behind the same endpoint (model_pool.py): loaded on first use, at most
    # max_loaded_models at once, unloaded after keep_alive seconds idle (None: never)
    extra_models: tuple[ServedModel, ...] = ()
    max_loaded_models: int = 1
    keep_alive: float | None = None
    model_size: int = 0  # bytes of the first model's file (0: unknown)
    reasoning_budget: int | None = None  # tokens of thought before </think> is forced (None: no limit)
    allow_image_urls: bool = False  # image_url parts may name http(s) URLs (--allow-image-urls)


def create_app(settings: ServerSettings, engine: AsyncEngine | None = None) -> FastAPI:
    """The app over `engine` (default: a local AsyncEngine on its own engine thread; the Ray
    Serve ingress passes a ClusterEngine). Its routes read a frozen snapshot of `settings`
    from `app.state.context` (context.py), so a later change to `settings` does not reach them."""
    fixed = engine is not None  # a given engine (the Ray Serve ingress's) is never unloaded
    if engine is None:
        engine = AsyncEngine(settings.config, max_queue=settings.max_queue, chat_fallback=settings.chat_fallback)

    def make(config: EngineConfig) -> AsyncEngine:
        made = AsyncEngine(config, max_queue=settings.max_queue, chat_fallback=settings.chat_fallback)
        made.reasoning_budget = settings.reasoning_budget
        made.allow_image_urls = settings.allow_image_urls
        return made

    engine.reasoning_budget = settings.reasoning_budget
    engine.allow_image_urls = settings.allow_image_urls

    first = ServedModel(settings.model_name, settings.config, settings.aliases, settings.model_size)
    pool = ModelPool((first, *settings.extra_models), engine, make, settings.max_loaded_models, settings.keep_alive,
                     fixed=fixed)
    ctx = ServerContext(engine=engine, pool=pool, api_keys=settings.api_keys, limits=settings.limits, read_timeout=settings.read_timeout,
                        write_timeout=settings.write_timeout, shutdown_timeout=settings.shutdown_timeout,
                        created=int(time.time()), on_fatal=settings.on_fatal)
    # /openapi.json describes every route's body (the fuzz tests generate requests from it)
    app = FastAPI(title="edge-infer", version=__version__, lifespan=_lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.context = ctx
    app.state.begin_drain = ctx.begin_drain  # `edge-infer serve` calls it on the loop at SIGTERM
    app.include_router(routes_status.router)
    app.include_router(routes_generate.router)
    app.include_router(routes_messages.router)
    app.include_router(routes_tokens.router)
    app.include_router(routes_slots.router)
    app.include_router(routes_lora.router)
    _install_error_handlers(app)
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)
    app.add_middleware(_CountRequests, engine=engine)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load the first model in the background while the server listens (the others load on
    first use), run the keep-alive sweeps; close every engine at exit."""
    ctx = server_context(app)
    engine = ctx.engine
    app.state.loop = asyncio.get_running_loop()
    loader = asyncio.create_task(_load(ctx))
    sweeper = asyncio.create_task(ctx.pool.run_sweeps())
    try:
        yield
    finally:
        sweeper.cancel()
        if engine.state == "loading":
            engine.state = "draining"
        await ctx.pool.close()
        if not loader.done():
            loader.cancel()


async def _load(ctx: ServerContext) -> None:
    engine = ctx.engine
    try:
        await ctx.pool.load_first()
    except Exception:
        msg = engine.error or "unknown error"
        print(f"edge-infer: error: cannot load the model: {msg}", file=sys.stderr, flush=True)
        if ctx.on_fatal is not None:
            ctx.on_fatal(msg)
        return
    if engine.state == "ready":
        print(f"edge-infer: {ctx.pool.primary} loaded in {engine.load_seconds or 0.0:.2f} s; ready",
              file=sys.stderr, flush=True)


def _install_error_handlers(app: FastAPI) -> None:
    """Errors in OpenAI's shape, or Anthropic's on the Messages API's paths."""

    def answer(request: Request, status: int, message: str, code: str | None = None,
               headers: Mapping[str, str] | None = None) -> Response:
        if request.url.path.startswith(routes_messages.PREFIX):
            body = anthropic_error_body(status, message)
        else:
            body = error_body(status, message, code=code)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> Response:
        dialect = "anthropic" if request.url.path.startswith(routes_messages.PREFIX) else "openai"
        return JSONResponse(e.body(dialect), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        msg = (
            f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        )
        return answer(request, e.status_code, msg, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> Response:
        return answer(request, 400, str(e), code="invalid_value")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return answer(request, 500, f"internal error: {type(e).__name__}")


class _CountRequests:
    """Pure ASGI middleware counting responses by endpoint and status (for /metrics)."""

    def __init__(self, app: Any, engine: AsyncEngine) -> None:
        self.app = app
        self.engine = engine

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            endpoint = path if path in ROUTES else "/v1/models" if path.startswith("/v1/models/") else "other"
            self.engine.metrics.requests[(endpoint, str(status[0]))] += 1
