"""Checks on a request before its route parses it: the Host header, the API key, the content
type of a JSON body, and the body's size as it arrives.

A web page cannot make a browser send a cross-origin `application/json` POST without a CORS
preflight (which the server refuses unless --cors-origin allows the page), so the JSON routes
accept nothing else. A DNS-rebinding page sends its own host name in Host, so a server that
answers only to its own names cannot be read by it. A body is counted as it streams in and
refused (413) as soon as it passes the limit: a Content-Length over it before any byte is read.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from edge_infer.server.errors import APIError, error_body

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"


def default_allowed_hosts(bind_host: str) -> tuple[str, ...]:
    """The Host names a server bound to `bind_host` answers to when --allowed-hosts is not given:
    any for a wildcard address (0.0.0.0, ::), whose names (the machine's, a proxy's) are not
    known here; else the bound address, plus localhost, 127.0.0.1 and ::1 when it is loopback."""
    h = bind_host.strip().strip("[]").lower()
    if h in ("", "0.0.0.0", "::", ANY_HOST):
        return (ANY_HOST,)
    return tuple(dict.fromkeys((h, *LOOPBACK_NAMES))) if is_loopback(h) else (h,)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, no port) is this machine's loopback."""
    h = host.strip().strip("[]").lower()
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str | None:
    """The host of a Host header (or of an --allowed-hosts entry) without its port, lower case:
    "Example.com:8000" -> "example.com", "[::1]:8000" -> "::1"; None when malformed."""
    h = value.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        if end < 0:
            return None
        name, rest = h[1:end], h[end + 1 :]
    else:
        name, sep, port = h.partition(":")
        rest = sep + port
    if rest and not (rest.startswith(":") and (rest[1:].isdigit() or rest == ":")):
        return None  # a bare IPv6 address, a second colon, a non-numeric port
    name = name.rstrip(".")
    try:
        return ipaddress.ip_address(name).compressed  # one spelling per address
    except ValueError:
        return name or None


def host_allowed(value: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a Host header value names one of `allowed` ("*" any, "*.example.com" its subdomains)."""
    if ANY_HOST in allowed:
        return True
    name = host_name(value) if value else None
    if name is None:
        return False
    for entry in allowed:
        if entry.startswith("*."):
            if name.endswith(entry[1:].lower()):
                return True
        elif entry_name(entry) == name:
            return True
    return False


def entry_name(entry: str) -> str | None:
    """An --allowed-hosts entry as host_name gives it: a name or address, an IPv6 one with or
    without brackets, a port ignored."""
    bare = entry.strip().strip("[]")
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        return host_name(entry)


class HostCheck:
    """Pure ASGI middleware: a request whose Host header is not allowed is a 400 in OpenAI's
    error shape, before any route runs (/health and /metrics included)."""

    def __init__(self, app: Any, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or ANY_HOST in self.allowed:
            await self.app(scope, receive, send)
            return
        raw = [v for k, v in scope.get("headers", ()) if k == b"host"]
        value = raw[0].decode("latin-1") if len(raw) == 1 else None
        if value is not None and host_allowed(value, self.allowed):
            await self.app(scope, receive, send)
            return
        what = "no Host header" if not raw else "more than one Host header" if len(raw) > 1 else f"Host {(value or '')[:100]!r}"
        msg = f"{what}: this server answers only to the host names of --allowed-hosts"
        response = JSONResponse(error_body(400, msg, code="invalid_host"), status_code=400,
                                headers={"Connection": "close"})
        await response(scope, receive, send)


def authorize(request: Request, api_keys: tuple[str, ...], x_api_key: bool = False) -> None:
    """401 unless `Authorization: Bearer KEY` names one of `api_keys` (no keys: anyone may call);
    x_api_key: Anthropic's `x-api-key: KEY` header is taken too."""
    if not api_keys:
        return
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if x_api_key and not header:
        header = key = request.headers.get("x-api-key", "")
        scheme = "bearer"
    # compare_digest: the time a comparison takes does not say how much of a key matched
    ok = scheme.lower() == "bearer" and any(hmac.compare_digest(key.strip().encode(), k.encode()) for k in api_keys)
    if not ok:
        send = "x-api-key: KEY or Authorization: Bearer KEY" if x_api_key else "Authorization: Bearer KEY"
        what = "invalid API key" if header else f"missing API key (send {send})"
        raise APIError(401, what, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def require_json(request: Request) -> None:
    """415 unless the body is declared as JSON (`application/json`, parameters such as charset allowed)."""
    ctype = request.headers.get("content-type")
    if (ctype or "").split(";", 1)[0].strip().lower() != "application/json":
        shown = f"got {ctype[:100]!r}" if ctype else "the request has none"
        raise APIError(415, f"Content-Type must be application/json ({shown})", code="unsupported_media_type")


def too_large(limit: int) -> APIError:
    # Connection: close, so the server reads no more of a body it has refused
    return APIError(413, f"the request body is larger than this server's limit of {limit} bytes (--max-body)",
                    code="body_too_large", headers={"Connection": "close"})


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes (at once when its
    Content-Length does) and with 408 when it has not arrived within `timeout` seconds."""
    length = request.headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0

    async def read() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)

    try:  # a client that sends its body slowly (or never) does not hold a connection forever
        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g}s", code="request_timeout") from None
    return b"".join(chunks)
