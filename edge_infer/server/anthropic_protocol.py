"""Anthropic's Messages API request (`POST /v1/messages`, `/v1/messages/count_tokens`) and its
translation into the OpenAI chat request the chat path runs (chat.py).

What each field becomes:
- `system` (a string or text blocks) -> a system message; user/assistant `content` (a string
  or blocks): text blocks joined, `tool_use` blocks -> the assistant's `tool_calls` (input as
  the arguments), `tool_result` blocks -> `tool` messages in place (an `is_error` result is
  prefixed "Error: "); earlier turns' `thinking` / `redacted_thinking` blocks are left out of the
  prompt, as the chat templates leave out earlier reasoning.
- `tools` (custom tools: name, description, input_schema, strict; input_examples are added to
  the description; eager_input_streaming is accepted: a call's input streams whole, as one
  delta, once parsed) -> function tools; `tool_choice` auto /
  any / tool / none -> auto / required / that function / none; `disable_parallel_tool_use` ->
  parallel_tool_calls false.
- `stop_sequences` -> stop; `max_tokens`, `temperature`, `top_p`, `top_k` as they are.
- `output_config.format` (json_schema) -> the structured output; `output_config.effort` and
  `thinking` set the reasoning budget (`reasoning_budget`; messages.py applies it).
- `cache_control` (top level and on blocks) is accepted: prefix caching is automatic.
  `context_management` takes clear_thinking edits (moot: earlier thinking is left out anyway).
- `max_tokens` past the room the prompt leaves in the context is cut to that room (messages.py):
  clients send their own large defaults (Claude Code 32,000), and the reply then ends max_tokens.
  `metadata`, `service_tier`, `inference_geo`, `speed`, `user_profile_id` and `workspace_id` are
  accepted without effect. `temperature`, `top_p` and `top_k`, which the 2026 SDKs no longer
  send, are still honoured when given.

Image and document blocks, Anthropic's server tools (web search, code execution, ...) and any
field not named here are 400s that name them (Anthropic's error shape, messages.py).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_infer.server.budgeted import EFFORT_BUDGETS
from edge_infer.server.errors import APIError
from edge_infer.server.protocol import ChatCompletionRequest

# Anthropic's rule for thinking.budget_tokens (its API refuses less)
MIN_THINKING_BUDGET = 1024
THINKING_TYPES = ("enabled", "adaptive", "between_tools", "disabled")
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # output_config.effort's values


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextBlock(_Strict):
    """A text block (system prompt, tool_result content); other types are refused by name."""

    type: str
    text: str | None = None
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ContentBlock(_Strict):
    """One block of a message's content: text, tool_use, tool_result, thinking or
    redacted_thinking (the fields of each; the others must be absent)."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    source: dict[str, Any] | None = None  # an image block's: {"type": "base64", "media_type", "data"} or {"type": "url", "url"}
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class InputMessage(_Strict):
    role: str
    content: str | list[ContentBlock]


class Tool(_Strict):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[dict[str, Any]] | None = None


class ToolChoice(_Strict):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(_Strict):
    type: str
    budget_tokens: int | None = None
    display: str | None = None


class OutputFormat(_Strict):
    type: str
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class OutputConfig(_Strict):
    effort: str | None = None
    format: OutputFormat | None = None


class CountTokensRequest(_Strict):
    """POST /v1/messages/count_tokens: what the prompt of a Messages request would hold."""

    model: str | None = None
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    keep_alive: int | float | str | None = None  # Ollama's, as on the other routes (model_pool.py)


# each block type's own fields (beside type, cache_control and citations)
_BLOCK_FIELDS = {"text": {"text"}, "image": {"source"}, "tool_use": {"id", "name", "input"},
                 "tool_result": {"tool_use_id", "content", "is_error"},
                 "thinking": {"thinking", "signature"}, "redacted_thinking": {"data"}}
_COMMON = {"type", "cache_control", "citations"}


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The OpenAI chat request that runs `req` (its sampling fields too, for a MessagesRequest)."""
    _refuse_extra(req, "")
    _context_management(req.context_management)
    messages: list[dict[str, Any]] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else _texts(req.system, "system")
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        messages.extend(_message(m, f"messages[{i}]"))
    body: dict[str, Any] = {"messages": messages}
    if req.tools is not None:
        body["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"], parallel = _tool_choice(req.tool_choice, req.tools)
        if parallel is not None:
            body["parallel_tool_calls"] = parallel
    if req.output_config is not None:
        _output_config(req.output_config, body)
    if isinstance(req, MessagesRequest):
        check_thinking(req.thinking, req.max_tokens)
        body["max_tokens"] = req.max_tokens
        for name in ("temperature", "top_p", "top_k"):
            if getattr(req, name) is not None:
                body[name] = getattr(req, name)
        if req.stop_sequences:
            body["stop"] = list(req.stop_sequences)
    else:
        check_thinking(req.thinking, None)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:  # a translation the chat request refuses: name what we sent
        raise APIError(400, f"the request cannot be run as a chat: {e.errors()[0]['msg']}", code="invalid_value") from None


def _context_management(cm: dict[str, Any] | None) -> None:
    """Context editing: `clear_thinking_*` edits (what Claude Code sends when it thinks) are what
    the prompt does anyway, as earlier turns' thinking never reaches it; other edits (clearing
    old tool results) are refused by name, as the conversation is run as sent."""
    if cm is None:
        return
    edits = cm.get("edits")
    if set(cm) - {"edits"} or not isinstance(edits, list):
        raise APIError(400, "context_management must be {\"edits\": [...]}", param="context_management",
                       code="invalid_value")
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if not isinstance(kind, str) or not kind.startswith("clear_thinking_"):
            raise APIError(400, f"context_management.edits[{i}]: only clear_thinking edits are supported (earlier "
                           f"thinking never reaches the prompt); got {kind!r}", param=f"context_management.edits[{i}]",
                           code="unsupported_parameter")


def check_thinking(thinking: Thinking | None, max_tokens: int | None) -> None:
    """Anthropic's rules: type enabled (budget_tokens >= 1024 and below max_tokens), adaptive,
    between_tools or disabled; display summarized or omitted."""
    if thinking is None:
        return
    if thinking.type not in THINKING_TYPES:
        raise APIError(400, f"thinking.type must be one of {', '.join(THINKING_TYPES)}, got {thinking.type!r}",
                       param="thinking.type", code="invalid_value")
    if thinking.display not in (None, "summarized", "omitted"):
        raise APIError(400, f"thinking.display must be summarized or omitted, got {thinking.display!r}",
                       param="thinking.display", code="invalid_value")
    budget = thinking.budget_tokens
    if thinking.type != "enabled":
        if budget is not None:
            raise APIError(400, f"thinking.budget_tokens belongs to type enabled, not {thinking.type}",
                           param="thinking.budget_tokens", code="invalid_value")
        return
    if budget is None or budget < MIN_THINKING_BUDGET:
        raise APIError(400, f"thinking.budget_tokens must be at least {MIN_THINKING_BUDGET}, got {budget}",
                       param="thinking.budget_tokens", code="invalid_value")
    if max_tokens is not None and budget >= max_tokens:
        raise APIError(400, f"thinking.budget_tokens ({budget}) must be less than max_tokens ({max_tokens})",
                       param="thinking.budget_tokens", code="invalid_value")


def reasoning_budget(req: CountTokensRequest) -> int | None:
    """Tokens the reply may think for: thinking.budget_tokens, else output_config.effort's share
    (EFFORT_BUDGETS), else None (no limit); 0 when thinking is disabled."""
    if req.thinking is not None and req.thinking.type == "disabled":
        return 0
    if req.thinking is not None and req.thinking.budget_tokens is not None:
        return req.thinking.budget_tokens
    effort = req.output_config.effort if req.output_config is not None else None
    return EFFORT_BUDGETS[effort] if effort is not None else None


def _output_config(config: OutputConfig, body: dict[str, Any]) -> None:
    if config.effort is not None and config.effort not in EFFORTS:
        raise APIError(400, f"output_config.effort must be one of {', '.join(EFFORTS)}, got {config.effort!r}",
                       param="output_config.effort", code="invalid_value")
    f = config.format
    if f is not None:
        if f.type != "json_schema" or f.schema_ is None:
            raise APIError(400, "output_config.format must be {type: json_schema, schema: {...}}",
                           param="output_config.format", code="invalid_value")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": f.schema_}}


def _message(m: InputMessage, at: str) -> list[dict[str, Any]]:
    """The chat messages of one Anthropic message (a user message's tool results each become a
    tool message, in their place among its text)."""
    if m.role not in ("user", "assistant"):
        raise APIError(400, f"{at}.role must be user or assistant, got {m.role!r} (the system prompt is the "
                       "top-level system field)", param=f"{at}.role", code="invalid_value")
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    out: list[dict[str, Any]] = []
    texts: list[Any] = []  # text, or an image block's image_url part
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(m.content):
        where = f"{at}.content[{j}]"
        _check_block(b, where, m.role)
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "image":
            texts.append({"type": "image_url", "image_url": {"url": _image_url(b.source, where)}})
        elif b.type == "tool_use":
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input or {}, ensure_ascii=False)}})
        elif b.type == "tool_result":
            if texts:  # text before a result stays before it
                out.append({"role": "user", "content": _joined(texts)})
                texts = []
            result = b.content if isinstance(b.content, str) else _texts(b.content or [], f"{where}.content")
            out.append({"role": "tool", "tool_call_id": b.tool_use_id,
                        "content": ("Error: " + result) if b.is_error else result})
    if m.role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
        if calls:
            msg["tool_calls"] = calls
        if texts or calls:
            out.append(msg)
        elif not out:  # only thinking blocks: an empty turn
            out.append({"role": "assistant", "content": ""})
    elif texts or not out:
        out.append({"role": "user", "content": _joined(texts)})
    return out


def _joined(items: list[Any]) -> Any:
    """A user turn's content: its texts joined by newlines, or (with images) OpenAI content parts."""
    if all(isinstance(x, str) for x in items):
        return "\n".join(items)
    return [{"type": "text", "text": x} if isinstance(x, str) else x for x in items]


def _image_url(source: dict[str, Any] | None, at: str) -> str:
    """An image block's source as the URL an image_url part carries (a data: URL for base64)."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not media.startswith("image/") or not isinstance(data, str):
            raise APIError(400, f"{at}.source: a base64 source needs media_type image/... and data", param=at,
                           code="invalid_value")
        return f"data:{media};base64,{data}"
    if kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
        return str(source["url"])
    raise APIError(400, f"{at}.source: an image source must be {{'type': 'base64', 'media_type', 'data'}} or "
                   f"{{'type': 'url', 'url'}}", param=at, code="invalid_value")


def _check_block(b: ContentBlock, where: str, role: str) -> None:
    if b.type in ("document", "search_result", "container_upload"):
        raise APIError(400, f"{where}: {b.type} blocks are not supported (text, image, tool_use, tool_result and "
                       "thinking are)", param=where, code="unsupported_parameter")
    own = _BLOCK_FIELDS.get(b.type)
    if own is None:
        raise APIError(400, f"{where}.type must be text, tool_use, tool_result, thinking or redacted_thinking, got "
                       f"{b.type!r}", param=f"{where}.type", code="invalid_value")
    given = {k for k in type(b).model_fields if getattr(b, k) is not None} | set(b.model_extra or {})
    stray = sorted(given - own - _COMMON)
    if stray:
        raise APIError(400, f"{where}.{stray[0]}: not a field of a {b.type} block", param=f"{where}.{stray[0]}",
                       code="unsupported_parameter")
    needs = {"text": ("text",), "image": ("source",), "tool_use": ("id", "name", "input"),
             "tool_result": ("tool_use_id",)}.get(b.type, ())
    for name in needs:
        if getattr(b, name) is None:
            raise APIError(400, f"{where}.{name} is required in a {b.type} block", param=f"{where}.{name}",
                           code="missing_required_parameter")
    if b.type == "tool_use" and role != "assistant" or b.type in ("tool_result", "image") and role != "user":
        owner = "assistant" if b.type == "tool_use" else "user"
        raise APIError(400, f"{where}: {b.type} blocks belong in {owner} messages", param=where, code="invalid_value")


def _texts(blocks: list[TextBlock], at: str) -> str:
    for j, b in enumerate(blocks):
        stray = sorted(set(b.model_extra or {}))
        if b.type != "text" or b.text is None or stray:
            what = f"unknown field {stray[0]}" if stray else f"type {b.type!r}" if b.type != "text" else "no text"
            raise APIError(400, f"{at}[{j}]: only text blocks are supported here ({what})", param=f"{at}[{j}]",
                           code="unsupported_parameter")
    return "\n".join(b.text or "" for b in blocks)


def _tool(t: Tool, at: str) -> dict[str, Any]:
    if t.type not in (None, "custom"):
        raise APIError(400, f"{at}.type {t.type!r}: Anthropic's server tools are not available here; give custom "
                       "tools (name, description, input_schema)", param=f"{at}.type", code="unsupported_parameter")
    if t.input_schema is None:
        raise APIError(400, f"{at}.input_schema is required", param=f"{at}.input_schema", code="missing_required_parameter")
    f: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
    description = t.description
    if t.input_examples:  # shown to the model with the description (its template prints that)
        examples = "\n".join(json.dumps(x, ensure_ascii=False) for x in t.input_examples)
        description = f"{description or ''}\nExample inputs:\n{examples}".lstrip()
    if description is not None:
        f["description"] = description
    if t.strict is not None:
        f["strict"] = t.strict
    return {"type": "function", "function": f}


def _tool_choice(c: ToolChoice, tools: list[Tool] | None) -> tuple[Any, bool | None]:
    parallel = None if c.disable_parallel_tool_use is None else not c.disable_parallel_tool_use
    if c.type in ("auto", "any", "none") and c.name is None:
        return {"auto": "auto", "any": "required", "none": "none"}[c.type], parallel
    if c.type == "tool" and c.name is not None:
        if not any(t.name == c.name for t in tools or ()):
            raise APIError(400, f"tool_choice.name {c.name!r} is not one of the tools", param="tool_choice.name",
                           code="invalid_value")
        return {"type": "function", "function": {"name": c.name}}, parallel
    raise APIError(400, "tool_choice must be {type: auto | any | none} or {type: tool, name: <one of the tools>}",
                   param="tool_choice", code="invalid_value")


def _refuse_extra(req: BaseModel, at: str) -> None:
    """A 400 naming the first field the server does not know, at any depth of the request
    (blocks are checked with their types in _check_block)."""
    for name in sorted(req.model_extra or {}):
        path = f"{at}.{name}" if at else name
        raise APIError(400, f"{path}: this field is not supported by edge-infer's Messages API", param=path,
                       code="unsupported_parameter")
    for name in type(req).model_fields:
        v = getattr(req, name)
        items = v if isinstance(v, list) else [v]
        for i, x in enumerate(items):
            if isinstance(x, BaseModel) and not isinstance(x, (ContentBlock, TextBlock)):
                _refuse_extra(x, (f"{at}.{name}" if at else name) + (f"[{i}]" if isinstance(v, list) else ""))
