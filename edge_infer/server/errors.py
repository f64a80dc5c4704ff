"""HTTP errors in OpenAI's JSON shape, and the mapping from EdgeInferError to status codes."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

from edge_infer.errors import (
    ChatTemplateError,
    EdgeInferError,
    GenerationError,
    InvalidRequest,
    OutOfMemoryBudget,
    TokenizerError,
)

# status -> OpenAI's error "type"
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
_FIELD = re.compile(r"^([a-z_]+)(?:\[\d+\])? ")
_CONTEXT = re.compile(r"prompt \((\d+) tokens\).*context length of (\d+)")


class APIError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self, dialect: str = "openai") -> dict[str, Any]:
        """The error object in the dialect of the route that failed ("openai" or "anthropic")."""
        if dialect == "anthropic":
            return anthropic_error_body(self.status, self.message)
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object for an HTTP status."""
    kind = _TYPES.get(status) or ("invalid_request_error" if status < 500 else "server_error")
    if code is None:
        try:
            code = HTTPStatus(status).phrase.lower().replace(" ", "_")
        except ValueError:
            code = None
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# status -> Anthropic's error "type" (its Messages API's error shape)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object for an HTTP status: {"type": "error", "error": {"type", "message"}}."""
    kind = _ANTHROPIC_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def from_engine_error(e: EdgeInferError, known_fields: set[str] | None = None) -> APIError:
    """The APIError for an engine-side failure: bad requests are 400, the rest 500.

    The parameter at fault is taken from the message when it starts with a request field name
    (SamplingParams' messages do: "temperature must be in [0.0, 100.0], got -1.0").
    """
    msg = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OutOfMemoryBudget) or "exceeds the maximum context length" in msg:
        m = _CONTEXT.search(msg)
        param: str | None = "max_tokens" if m and int(m.group(1)) < int(m.group(2)) else "prompt"
        return APIError(400, msg, param=param, code="context_length_exceeded")
    if isinstance(e, (InvalidRequest, ChatTemplateError, TokenizerError)):
        param = None
        m = _FIELD.match(msg)
        if m and (known_fields is None or m.group(1) in known_fields):
            param = m.group(1)
        if isinstance(e, ChatTemplateError):
            param = "messages"
        return APIError(400, msg, param=param, code="invalid_value")
    if isinstance(e, GenerationError):
        return APIError(500, msg, code="generation_failed")
    return APIError(500, msg, code="internal_error")
