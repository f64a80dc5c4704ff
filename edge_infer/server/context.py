"""What the routes of one app read: a frozen `ServerContext` on `app.state.context`.

`create_app` builds it once from the ServerSettings and the engine client; a handler reaches it
through `request.app` (the SSE writer through its ASGI scope's "app"), so nothing about one app
lives in a closure or a module global and two apps in a process never share a setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from edge_infer.server.errors import APIError
from edge_infer.server.http_guards import authorize, read_body, require_json
from edge_infer.server.limits import RequestLimits
from edge_infer.server.protocol import parse_body

if TYPE_CHECKING:
    from edge_infer.server.engine_client import AsyncEngine
    from edge_infer.server.model_pool import ModelPool

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class ServerContext:
    """One app's engine client and the settings its routes and lifespan read. Timeouts in
    seconds; created: Unix seconds, the model cards' `created`. engine: the first model's
    (loaded at start-up); pool: every served model's, which the model routes go through."""

    engine: AsyncEngine
    pool: ModelPool
    api_keys: tuple[str, ...]
    limits: RequestLimits
    read_timeout: float  # for a request body to arrive (408 after)
    write_timeout: float  # a streaming client may read nothing for this long before it is dropped
    shutdown_timeout: float  # in-flight requests get this long to finish once draining begins
    created: int
    on_fatal: Callable[[str], None] | None = field(default=None, repr=False)

    def check_serving(self) -> None:
        """503 while shutting down, and for a one-model server while its model loads (or failed to)
        at start-up. Once unloaded by keep-alive it is not this engine any more: the pool loads it
        again on the next request, as it does every model of a server of several."""
        if self.pool.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        starting = self.pool.engines.get(self.pool.primary) is self.engine
        if len(self.pool.models) == 1 and starting:
            self.engine.check_ready()

    def begin_drain(self) -> None:
        """Start shutting down: new requests get 503, running ones shutdown_timeout to end."""
        self.engine.begin_drain(self.shutdown_timeout)
        self.pool.begin_drain(self.shutdown_timeout)


def server_context(app: Any) -> ServerContext:
    """The context `create_app` put on `app` (a Starlette app, `request.app` or `scope["app"]`)."""
    ctx: ServerContext = app.state.context
    return ctx


async def parse_request(request: Request, model: type[M], x_api_key: bool = False) -> tuple[ServerContext, M]:
    """A JSON route's body as `model`, checked in order: the API key (401; x_api_key: Anthropic's
    header is taken too), the content type (415), a serving server (503), the body's arrival and
    size (408, 413), then its fields (400). The route then takes its model from ctx.pool."""
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys, x_api_key)
    require_json(request)
    ctx.check_serving()
    body = await read_body(request, ctx.limits.max_body, ctx.read_timeout)
    return ctx, parse_body(body, model, ctx.limits)
