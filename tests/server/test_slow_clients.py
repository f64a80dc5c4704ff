"""Clients that send their body slowly or never read their stream do not hold the server: a
stalled body is a 408 after --read-timeout; a stream nobody reads is dropped after
--write-timeout, its requests aborted (their KV freed by the abort path the disconnect tests
cover)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(start_server, smollm2_path: Path):  # type: ignore[no-untyped-def]
    return start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "64MiB", "--max-model-len", "2048",
                        "--read-timeout", "1", "--write-timeout", "2")


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_stalled_body_is_408(server) -> None:  # type: ignore[no-untyped-def]
    s = _connect(server.url)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"prompt\":")
    t = time.monotonic()
    reply = s.recv(4096).decode(errors="replace")
    s.close()
    assert reply.startswith("HTTP/1.1 408") and time.monotonic() - t < 10, reply[:200]


def test_a_stream_nobody_reads_is_dropped() -> None:
    """SSEResponse against a client whose send never completes: after the write timeout of the
    app serving it (read from the scope's app) the producer gives up and closes its chunk
    iterator (which aborts the requests behind it)."""
    from edge_infer.server import streaming

    # only the write timeout is read from the app's ServerContext
    app = SimpleNamespace(state=SimpleNamespace(context=SimpleNamespace(write_timeout=0.2)))
    closed = []

    async def chunks():  # type: ignore[no-untyped-def]
        try:
            while True:
                yield {"choices": [{"delta": {"content": "x"}}]}
        finally:
            closed.append(True)

    started = []

    async def send(message: dict) -> None:  # type: ignore[type-arg]
        if message["type"] == "http.response.start":
            started.append(True)
            return
        await asyncio.Event().wait()  # the client never reads

    async def receive() -> dict:  # type: ignore[type-arg]
        await asyncio.Event().wait()
        return {}

    t = time.monotonic()
    asyncio.run(asyncio.wait_for(streaming.SSEResponse(chunks(), lambda: False)({"app": app}, receive, send), 10))
    assert started and closed and time.monotonic() - t < 5
