"""OpenAI's Responses API request (`POST /v1/responses`, stateless as in llama-server and Ollama)
and its translation into the chat request the chat path runs (chat.py).

What each field becomes:
- `instructions` -> a system message first; `input` as a string -> one user message, or as items:
  messages (`role` user / system / developer / assistant; content a string or input_text /
  output_text parts), `function_call` -> the assistant's tool call, `function_call_output` ->
  a tool message; `reasoning` items of earlier turns are left out of the prompt, as the chat
  templates leave out earlier reasoning.
- `tools` (function tools: name, description, parameters, strict) -> function tools;
  `tool_choice` auto / none / required / {type: function, name}; `parallel_tool_calls`.
- `max_output_tokens` -> max_tokens; `temperature`, `top_p` as they are; `text.format` text /
  json_object / json_schema -> the structured output; `reasoning.effort` -> the reasoning
  budget (budgeted.py).
- Accepted without effect: `store` (nothing is stored: `previous_response_id` is a 400),
  `metadata`, `user`, `safety_identifier`, `prompt_cache_key`, `prompt_cache_retention` (prefix
  caching is automatic), `service_tier`, `text.verbosity`, `reasoning.summary` (the reasoning
  comes whole, as reasoning_text), `include` of "reasoning.encrypted_content" (none is made),
  `truncation` "disabled", `stream_options`.

Image and file inputs, other tool kinds (web search, shell, custom, MCP) and any field not named
here are 400s that name them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from edge_infer.server.budgeted import EFFORT_BUDGETS
from edge_infer.server.errors import APIError
from edge_infer.server.protocol import ChatCompletionRequest

INCLUDES = ("reasoning.encrypted_content",)
_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ContentPart(_Strict):
    type: str
    text: str | None = None
    image_url: str | None = None  # input_image: a data: URL (or an http(s) URL with --allow-image-urls)
    detail: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputItem(_Strict):
    """One item of `input`: a message (type absent or "message"), function_call,
    function_call_output or reasoning (the fields of each; the others must be absent)."""

    type: str | None = None
    role: str | None = None
    content: str | list[ContentPart] | None = None
    id: str | None = None
    status: str | None = None
    phase: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ContentPart] | None = None
    summary: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None


class FunctionTool(_Strict):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class Reasoning(_Strict):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(_Strict):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    keep_alive: int | float | str | None = None  # Ollama's, as on the other routes (model_pool.py)


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The OpenAI chat request that runs `req`."""
    _refuse(req)
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for i, item in enumerate(req.input):
            _item(item, f"input[{i}]", messages)
    body: dict[str, Any] = {"messages": messages}
    if req.tools is not None:
        body["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    for src, dst in (("parallel_tool_calls", "parallel_tool_calls"), ("max_output_tokens", "max_tokens"),
                     ("temperature", "temperature"), ("top_p", "top_p")):
        if getattr(req, src) is not None:
            body[dst] = getattr(req, src)
    fmt = req.text.format if req.text is not None else None
    if fmt is not None:
        body["response_format"] = _text_format(fmt)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:  # a translation the chat request refuses
        raise APIError(400, f"the request cannot be run as a chat: {e.errors()[0]['msg']}", code="invalid_value") from None


def reasoning_budget(req: ResponsesRequest) -> int | None:
    """reasoning.effort's budget in tokens (none: 0, no thought); None without one."""
    effort = req.reasoning.effort if req.reasoning is not None else None
    return EFFORT_BUDGETS[effort] if effort is not None else None


def _refuse(req: ResponsesRequest) -> None:
    def bad(param: str, why: str, code: str = "unsupported_parameter") -> APIError:
        return APIError(400, f"{param}: {why}", param=param, code=code)

    for sub, at in ((req, ""), (req.text, "text."), (req.reasoning, "reasoning.")):
        for name in sorted((sub.model_extra or {}) if sub is not None else {}):
            raise bad(at + name, "this field is not supported by edge-infer's Responses API")
    if req.previous_response_id is not None:
        raise bad("previous_response_id", "this server keeps no responses (it is stateless, as llama-server is): send "
                  "the whole conversation as input items")
    for i, inc in enumerate(req.include or ()):
        if inc not in INCLUDES:
            raise bad(f"include[{i}]", f"{inc!r} cannot be included here (only {', '.join(INCLUDES)}, which adds nothing)")
    if req.truncation not in (None, "disabled"):
        raise bad("truncation", "only \"disabled\" (a conversation longer than the context is a 400)")
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None and effort not in EFFORT_BUDGETS:
        raise bad("reasoning.effort", f"must be one of {', '.join(EFFORT_BUDGETS)}, got {effort!r}", "invalid_value")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad("max_output_tokens", f"must be at least 1, got {req.max_output_tokens}", "invalid_value")


def _item(item: InputItem, at: str, out: list[dict[str, Any]]) -> None:
    kind = item.type or "message"
    if kind not in _ITEM_TYPES:
        raise APIError(400, f"{at}.type {kind!r}: only message, function_call, function_call_output and reasoning "
                       "items are supported", param=f"{at}.type", code="unsupported_parameter")
    own = {"message": {"role", "content", "id", "status", "phase"},
           "function_call": {"call_id", "name", "arguments", "id", "status"},
           "function_call_output": {"call_id", "output", "id", "status", "name"},
           "reasoning": {"id", "summary", "content", "encrypted_content", "status"}}[kind]
    given = {k for k in type(item).model_fields if getattr(item, k) is not None} | set(item.model_extra or {})
    stray = sorted(given - own - {"type"})
    if stray:
        raise APIError(400, f"{at}.{stray[0]}: not a field of a {kind} item", param=f"{at}.{stray[0]}",
                       code="unsupported_parameter")
    if kind == "message":
        if item.role not in ("user", "system", "developer", "assistant"):
            raise APIError(400, f"{at}.role must be user, system, developer or assistant, got {item.role!r}",
                           param=f"{at}.role", code="invalid_value")
        if item.content is None:
            raise APIError(400, f"{at}.content is required", param=f"{at}.content", code="missing_required_parameter")
        out.append({"role": item.role, "content": _text(item.content, f"{at}.content", images=True)})
    elif kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if getattr(item, name) is None:
                raise APIError(400, f"{at}.{name} is required in a function_call item", param=f"{at}.{name}",
                               code="missing_required_parameter")
        call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)  # parallel calls: one assistant turn
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        if item.call_id is None or item.output is None:
            name = "call_id" if item.call_id is None else "output"
            raise APIError(400, f"{at}.{name} is required in a function_call_output item", param=f"{at}.{name}",
                           code="missing_required_parameter")
        out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{at}.output")})


def _text(content: str | list[ContentPart], at: str, images: bool = False) -> Any:
    """A message's text (its parts joined by newlines); with images (input_image parts, where
    allowed) OpenAI chat content parts instead."""
    if isinstance(content, str):
        return content
    if images and any(p.type == "input_image" for p in content):
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            if part.type == "input_image":
                if not part.image_url or part.text is not None or part.model_extra:
                    raise APIError(400, f"{at}[{j}]: an input_image part needs image_url (file_id is not supported)",
                                   param=f"{at}[{j}]", code="unsupported_parameter")
                parts.append({"type": "image_url", "image_url": {"url": part.image_url}})
            else:
                parts.append({"type": "text", "text": _text([part], at)})
        return parts
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text") or part.text is None or part.model_extra or part.image_url:
            what = f"type {part.type!r}" if part.type not in ("input_text", "output_text", "text") else "its fields"
            raise APIError(400, f"{at}[{j}]: only text parts are supported ({what})", param=f"{at}[{j}]",
                           code="unsupported_parameter")
    return "\n".join(p.text or "" for p in content)


def _tool(t: FunctionTool, at: str) -> dict[str, Any]:
    if t.type != "function" or t.model_extra:
        what = f"type {t.type!r}" if t.type != "function" else f"field {sorted(t.model_extra or {})[0]}"
        raise APIError(400, f"{at}: only function tools are supported ({what})", param=f"{at}", code="unsupported_parameter")
    if t.name is None:
        raise APIError(400, f"{at}.name is required", param=f"{at}.name", code="missing_required_parameter")
    f: dict[str, Any] = {"name": t.name, "parameters": t.parameters or {"type": "object", "properties": {}}}
    if t.description is not None:
        f["description"] = t.description
    if t.strict is not None:
        f["strict"] = t.strict
    return {"type": "function", "function": f}


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str) \
            and set(choice) == {"type", "name"}:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                   param="tool_choice", code="invalid_value")


def _text_format(fmt: dict[str, Any]) -> dict[str, Any]:
    kind = fmt.get("type")
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return {"type": kind}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict) and set(fmt) <= {"type", "name", "schema", "strict",
                                                                                    "description"}:
        js = {k: v for k, v in fmt.items() if k != "type"}
        js.setdefault("name", "output")
        return {"type": "json_schema", "json_schema": js}
    raise APIError(400, "text.format must be {type: text}, {type: json_object} or {type: json_schema, name, schema, "
                   "strict, description}", param="text.format", code="invalid_value")
