"""The FastAPI application: routes, API keys, CORS, errors in OpenAI's shape, request counts.

The model loads in the background after the server starts listening: /health is 503 until
it is ready (and while shutting down), 200 after. /health and /metrics stay open when API
keys are set; everything else needs `Authorization: Bearer KEY`. Every route answers only to
the Host names of --allowed-hosts; the JSON routes take only `application/json` bodies, read
up to --max-body bytes (http_guards.py).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, PlainTextResponse, Response

from edge_infer._version import __version__
from edge_infer.config import EngineConfig
from edge_infer.errors import EdgeInferError
from edge_infer.server import streaming
from edge_infer.server.chat import create_chat_completion
from edge_infer.server.completions import create_completion
from edge_infer.server.embeddings import create_embeddings
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError, error_body, from_engine_error
from edge_infer.server.http_guards import LOOPBACK_NAMES, HostCheck, read_body, require_json
from edge_infer.server.limits import RequestLimits
from edge_infer.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    parse_body,
    template_messages,
)
from edge_infer.server.schema import body_schema

log = logging.getLogger("edge_infer.server")
ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/health", "/metrics", "/tokenize", "/detokenize")


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


def create_app(settings: ServerSettings, engine: AsyncEngine | None = None) -> FastAPI:
    """The app over `engine` (default: a local AsyncEngine on its own engine thread; the Ray
    Serve ingress passes a ClusterEngine)."""
    if engine is None:
        engine = AsyncEngine(settings.config, max_queue=settings.max_queue, chat_fallback=settings.chat_fallback)
    streaming.WRITE_TIMEOUT_S[0] = settings.write_timeout
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        loader = asyncio.create_task(_load(engine, settings))
        try:
            yield
        finally:
            if engine.state == "loading":
                engine.state = "draining"
            await engine.close()
            if not loader.done():
                loader.cancel()

    # /openapi.json describes every route's body (the fuzz tests generate requests from it)
    app = FastAPI(title="edge-infer", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.engine = engine
    app.state.settings = settings

    def begin_drain() -> None:
        engine.begin_drain(settings.shutdown_timeout)

    app.state.begin_drain = begin_drain

    def authorize(request: Request) -> None:
        if not settings.api_keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        ok = scheme.lower() == "bearer" and any(hmac.compare_digest(key.strip().encode(), k.encode())
                                                for k in settings.api_keys)
        if not ok:
            what = "invalid API key" if header else "missing API key (send Authorization: Bearer KEY)"
            raise APIError(401, what, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_model(name: str | None) -> str:
        if name is not None and name != settings.model_name and name not in settings.aliases:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {settings.model_name!r}",
                           param="model", code="model_not_found")
        return settings.model_name

    async def body(request: Request) -> bytes:
        authorize(request)
        require_json(request)
        engine.check_ready()
        return await read_body(request, settings.limits.max_body, settings.read_timeout)

    @app.get("/health")
    async def health() -> Response:
        if engine.state == "ready":
            return JSONResponse({"status": "ok"})
        try:
            engine.check_ready()
        except APIError as e:
            return JSONResponse(e.body(), status_code=503, headers=e.headers)
        return JSONResponse({"status": "ok"})  # pragma: no cover

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [_model_card(settings.model_name, created, engine)]})

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str) -> Response:
        authorize(request)
        return JSONResponse(_model_card(check_model(model), created, engine))

    @app.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        req = parse_body(await body(request), CompletionRequest, settings.limits)
        return await create_completion(req, engine, check_model(req.model), request.receive)

    @app.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        req = parse_body(await body(request), ChatCompletionRequest, settings.limits)
        return await create_chat_completion(req, engine, check_model(req.model), request.receive)

    @app.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingRequest))
    async def embeddings(request: Request) -> Response:
        req = parse_body(await body(request), EmbeddingRequest, settings.limits)
        return JSONResponse(await create_embeddings(req, engine, check_model(req.model)))

    @app.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
    async def tokenize(request: Request) -> Response:
        req = parse_body(await body(request), TokenizeRequest, settings.limits)
        check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give either prompt or messages", param="prompt", code="invalid_value")
        tok = engine.tokenizer
        assert tok is not None
        if req.prompt is not None:
            text, special = req.prompt, req.add_special_tokens is not False
            ids = await engine.run(lambda: tok.encode(text, add_special=special, parse_special=False))
        else:
            msgs = template_messages(req.messages or [])
            ids = await engine.chat_prompt(msgs, add_generation_prompt=req.add_generation_prompt is not False)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len})

    @app.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
    async def detokenize(request: Request) -> Response:
        req = parse_body(await body(request), DetokenizeRequest, settings.limits)
        check_model(req.model)
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

    @app.get("/metrics")
    async def metrics() -> Response:
        snapshot = None
        if engine.state in ("ready", "draining") and engine.worker is not None:
            snapshot = await engine.call(lambda e: e.metrics())
        text = engine.metrics.render(snapshot, ready=engine.state == "ready", in_flight=len(engine.in_flight))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    _install_error_handlers(app)
    app.add_middleware(HostCheck, allowed=settings.allowed_hosts)  # type: ignore[arg-type]
    app.add_middleware(_CountRequests, engine=engine)  # type: ignore[arg-type]
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),  # type: ignore[arg-type]
                           allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])
    return app


async def _load(engine: AsyncEngine, settings: ServerSettings) -> None:
    try:
        await engine.load()
    except Exception:
        msg = engine.error or "unknown error"
        print(f"edge-infer: error: cannot load the model: {msg}", file=sys.stderr, flush=True)
        if settings.on_fatal is not None:
            settings.on_fatal(msg)
        return
    if engine.state == "ready":
        print(f"edge-infer: {settings.model_name} loaded in {engine.load_seconds or 0.0:.2f} s; ready",
              file=sys.stderr, flush=True)


def _model_card(name: str, created: int, engine: AsyncEngine) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "edge-infer",
            "max_model_len": engine.max_model_len or None}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> Response:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        msg = (
            f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        )
        return JSONResponse(error_body(e.status_code, msg), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> Response:
        return JSONResponse(error_body(400, str(e), code="invalid_value"), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(e).__name__}"), status_code=500)


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
