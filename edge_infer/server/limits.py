"""The server's per-request limits (`edge-infer serve --max-body ...`) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from edge_infer.errors import InvalidRequest
from edge_infer.server.errors import APIError

MAX_BODY_BYTES = 32 * 2**20
MAX_CHARS = 4 * 2**20  # ~1 M tokens of English: far beyond any context, a fraction of a second to tokenize


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Per-request limits of the server (`edge-infer serve --max-body ...`); going over one is a
    400 (413 for the body) that names the field and the limit."""

    max_body: int = MAX_BODY_BYTES  # bytes of a request body
    max_n: int = 16  # completions per request (n)
    max_stop: int = 16  # stop strings
    max_stop_chars: int = 512  # characters of one stop string
    max_logit_bias: int = 1024  # logit_bias entries
    max_messages: int = 2048  # chat messages
    max_tools: int = 128  # tools
    max_inputs: int = 2048  # embeddings inputs / completions prompts / rerank documents
    max_chars: int = MAX_CHARS  # characters of text: messages, tools, prompts, inputs, query, documents together

    def __post_init__(self) -> None:
        for name in ("max_body", "max_n", "max_stop", "max_stop_chars", "max_logit_bias", "max_messages", "max_tools",
                     "max_inputs", "max_chars"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidRequest(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")

    def check(self, req: BaseModel) -> None:
        """The request's sizes against the limits."""
        def over(field: str, size: int, limit: int, what: str) -> None:
            if size > limit:
                raise APIError(400, f"{field}: {size} {what} is over this server's limit of {limit}", param=field,
                               code="limit_exceeded")

        if _get(req, "n") is not None:
            over("n", int(_get(req, "n")), self.max_n, "completions")
        stop = _get(req, "stop")
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        over("stop", len(stops), self.max_stop, "stop strings")
        for st in stops:
            over("stop", len(st), self.max_stop_chars, "characters in a stop string")
        over("logit_bias", len(_get(req, "logit_bias") or {}), self.max_logit_bias, "entries")
        over("messages", len(_get(req, "messages") or []), self.max_messages, "messages")
        over("tools", len(_get(req, "tools") or []), self.max_tools, "tools")
        for name in ("prompt", "input", "documents"):
            v = _get(req, name)
            if isinstance(v, list) and v and not all(_is_int(t) for t in v):
                over(name, len(v), self.max_inputs, "inputs")
        # Before any templating or tokenizing, which cost CPU in proportion to the text.
        sizes = {name: _chars(_get(req, name)) for name in ("messages", "tools", "prompt", "input", "query", "documents")}
        total = sum(sizes.values())
        if total > self.max_chars:
            field = max(sizes, key=lambda k: sizes[k])
            raise APIError(400, f"{field}: the request holds {total} characters of text (messages, tools, prompts), "
                           f"over this server's limit of {self.max_chars}", param=field, code="limit_exceeded")


def _chars(v: Any) -> int:
    """Characters of the strings in a request field (message contents, names, tool-call arguments,
    tool schemas' keys and values; token ids are not text). Iterative: a deeply nested tool
    schema is counted, not a RecursionError."""
    total, stack = 0, [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x)
        elif isinstance(x, BaseModel):
            stack.extend(getattr(x, k) for k in type(x).model_fields)
            stack.extend((x.model_extra or {}).values())
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _get(req: BaseModel, name: str) -> Any:
    return getattr(req, name, None)
