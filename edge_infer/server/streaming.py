"""Server-sent events in OpenAI's and Anthropic's framings, and client-disconnect detection.

`SSEResponse` sends each chunk as `data: {json}\\n\\n` and ends with `data: [DONE]\\n\\n`
(OpenAI's chat framing), or as `event: {type}\\ndata: {json}\\n\\n` with nothing after the last
(Anthropic's and the Responses API's: each chunk's "type" is its event name).
A task watches the connection: when the client goes away the producer is cancelled, which
(through `merge`'s cleanup) aborts its engine requests and frees their KV blocks. An error
after the stream has started is sent as a `data: {"error": ...}` event before [DONE] (an
`error` event in the other two framings).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive

from edge_infer.errors import EdgeInferError
from edge_infer.server.context import server_context
from edge_infer.server.errors import APIError, from_engine_error

log = logging.getLogger("edge_infer.server")

Send = Callable[[dict[str, Any]], Awaitable[None]]
T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the request body must have been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and raising ClientGone) if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def finished_or_gone(receive: Receive, work: Awaitable[T], draining: Callable[[], bool]) -> T | None:
    """`work`'s result for a non-streaming answer: None when the client went away first (the work
    is cancelled), a failure as the APIError to answer."""
    try:
        return await race_disconnect(receive, work)
    except ClientGone:
        return None
    except Exception as e:
        raise error_for(e, draining()) from None


def error_for(e: BaseException, draining: bool) -> APIError:
    """The APIError to report for a failure while a request was running."""
    if isinstance(e, APIError):
        return e
    if draining:
        return APIError(503, "the server is shutting down; the request was aborted", code="shutting_down")
    if isinstance(e, EdgeInferError):
        return from_engine_error(e)
    log.exception("request failed", exc_info=e)
    # the type only: the message (logged) may name what other requests or the host are
    return APIError(500, f"internal error: {type(e).__name__} (the server log has the details)", code="internal_error")


async def _send(send: Send, body: bytes, more: bool, timeout: float) -> None:
    """Send one part of the body; ClientGone when the client has not taken it in `timeout` seconds."""
    try:
        await asyncio.wait_for(send({"type": "http.response.body", "body": body, "more_body": more}), timeout)
    except asyncio.TimeoutError:
        raise ClientGone() from None


class SSEResponse(Response):
    """A response streaming `chunks` (dicts) as server-sent events. A client that stops reading
    for the serving app's write timeout (its ServerContext's, found through the ASGI scope) is
    treated as gone: its requests are aborted and their KV freed."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]], is_draining: Callable[[], bool],
                 dialect: str = "openai") -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.chunks = chunks
        self.is_draining = is_draining
        self.dialect = dialect

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:  # type: ignore[override]
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]
        timeout = server_context(scope["app"]).write_timeout
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        producer = asyncio.ensure_future(self._produce(send, timeout))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not producer.done():  # the client left: cancelling the producer aborts its requests
                log.debug("client disconnected mid-stream")
                producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        finally:
            watcher.cancel()
            if not producer.done():
                producer.cancel()

    async def _produce(self, send: Send, timeout: float) -> None:
        sent = 0
        try:
            try:
                try:
                    async for chunk in self.chunks:
                        await _send(send, self._event(chunk), True, timeout)
                        sent += 1
                finally:
                    await self.chunks.aclose()  # type: ignore[attr-defined]
            except (asyncio.CancelledError, ClientGone):
                raise
            except Exception as e:
                err = error_for(e, self.is_draining())
                await _send(send, self._event(self._error(err, sent)), True, timeout)
            await _send(send, b"data: [DONE]\n\n" if self.dialect == "openai" else b"", False, timeout)
        except ClientGone:
            log.info("dropped a streaming client that read nothing for %.0fs", timeout)

    def _error(self, err: APIError, sent: int) -> dict[str, Any]:
        """The error event of this stream's dialect (the Responses API numbers it after the
        events already sent)."""
        if self.dialect == "responses":
            return {"type": "error", "code": err.code, "message": err.message, "param": err.param, "sequence_number": sent}
        body = err.body(self.dialect)
        if self.dialect == "openai":
            body["error"]["code"] = body["error"]["code"] or err.status
        return body

    def _event(self, obj: dict[str, Any]) -> bytes:
        data = b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
        return data if self.dialect == "openai" else b"event: " + str(obj["type"]).encode() + b"\n" + data
