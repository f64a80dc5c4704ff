"""Request bodies of the OpenAI-compatible API: parsing, strict type checks, SamplingParams.

Types are checked strictly (a string where a number belongs is a 400, never coerced); values
are checked by SamplingParams and the engine. A field that is not implemented is a 400 naming
it, except the few accepted with no effect (IGNORED_FIELDS, listed in the README); a
request-supplied chat template is refused. Structured outputs come as OpenAI's
`response_format`, vLLM's `structured_outputs`, or its older `guided_*` fields (one of them).
"""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from edge_infer.errors import InvalidRequest
from edge_infer.sampling_params import SamplingParams, StructuredOutputsParams
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.limits import RequestLimits
from edge_infer.server.tools import FUNCTION_NAME

log = logging.getLogger("edge_infer.server")
ROLES = ("system", "developer", "user", "assistant", "tool")
REFUSED_FIELDS = ("chat_template", "chat_template_kwargs")
# accepted and without effect on generation (OpenAI platform bookkeeping)
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier")
# vLLM's older names of the structured-outputs fields
GUIDED_ALIASES = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# Request fields copied into SamplingParams when given (not null).
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                    "frequency_penalty", "repetition_penalty", "logit_bias", "min_tokens", "ignore_eos",
                    "skip_special_tokens", "include_stop_str_in_output", "stop_token_ids")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Strict):
    include_usage: bool | None = False


class LoraEntry(BaseModel):
    """One item of llama.cpp's request field `lora`: an adapter's id (GET /lora-adapters) and scale."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: int
    scale: float


class _Sampling(_Strict):
    model: str | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    keep_alive: int | float | str | None = None  # Ollama's: how long the model stays loaded after
    # llama.cpp's per-request LoRA adapters [{"id", "scale"}]; routes_lora.request_lora reads it
    lora: list[LoraEntry] | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None,
                        extra_stop: tuple[str, ...] = ()) -> SamplingParams:
        """SamplingParams from the given fields; bad values raise APIError(400) naming the field."""
        opts: dict[str, Any] = {k: getattr(self, k) for k in _SAMPLING_FIELDS if getattr(self, k) is not None}
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        if stop or extra_stop:
            opts["stop"] = tuple(stop) + extra_stop
        opts["max_tokens"] = max_tokens
        opts["logprobs"] = logprobs
        try:
            so = self.structured()
            if so is not None:
                opts["structured_outputs"] = so
            return SamplingParams(**opts)
        except InvalidRequest as e:
            raise from_engine_error(e, set(type(self).model_fields)) from None

    def structured(self) -> StructuredOutputsParams | None:
        """The request's constraint from whichever one field carries it (two is a 400)."""
        given = [n for n in ("response_format", "structured_outputs", *GUIDED_ALIASES) if getattr(self, n) is not None]
        if len(given) > 1:
            raise APIError(400, f"give one of {', '.join(given)}: they all set the structured output",
                           param=given[1], code="invalid_value")
        if not given:
            return None
        name = given[0]
        if name == "structured_outputs":
            return StructuredOutputsParams.from_dict(dict(self.structured_outputs or {}))
        if name in GUIDED_ALIASES:
            return StructuredOutputsParams(**{GUIDED_ALIASES[name]: getattr(self, name)})
        return response_format(self.response_format or {})


class CompletionRequest(_Sampling):
    prompt: Any = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts: a string, a list of strings, a token id list, or a list of those."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p, list) and p:
            if all(_is_int(t) for t in p):
                return [list(p)]
            if all(
                isinstance(x, str) or (isinstance(x, list) and x and all(_is_int(t) for t in x)) for x in p
            ):
                return list(p)
        raise APIError(400, "prompt must be a string, a list of strings, a list of token ids, or a list of "
                       "token id lists (none of them empty)", param="prompt", code="invalid_type")


class ImageURL(_Strict):
    url: str
    detail: str | None = None  # OpenAI's low / high / auto: accepted, the projector decides the tiling


class ContentPart(_Strict):
    type: str
    text: str | None = None
    image_url: ImageURL | None = None


class ToolCallFunction(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: str = "function"
    function: ToolCallFunction


class ChatMessage(_Strict):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages as plain dicts for the chat template; bad roles or parts are 400s."""
        return template_messages(self.messages)


class EmbeddingRequest(_Strict):
    model: str | None = None
    input: Any = None
    encoding_format: str | None = "float"
    dimensions: int | None = None
    user: str | None = None
    keep_alive: int | float | str | None = None

    def inputs(self) -> list[str | list[int]]:
        """The inputs: a string, a list of strings, a token id list, or a list of those."""
        p = self.input
        if isinstance(p, str) and p:
            return [p]
        if isinstance(p, list) and p:
            if all(_is_int(t) for t in p):
                return [list(p)]
            if all((isinstance(x, str) and x) or (isinstance(x, list) and x and all(_is_int(t) for t in x)) for x in p):
                return list(p)
        raise APIError(400, "input must be a non-empty string, a list of them, a list of token ids, or a list of "
                       "token id lists", param="input", code="invalid_type")


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


M = TypeVar("M", bound=BaseModel)


def parse_body(raw: bytes, model: type[M], limits: RequestLimits | None = None) -> M:
    """Decode, parse and type-check a JSON request body, then check it against the limits;
    every failure is an APIError(400), a body over the limit a 413."""
    limits = limits or RequestLimits()
    if len(raw) > limits.max_body:
        raise APIError(413, f"the request body is larger than this server's limit of {limits.max_body} bytes",
                       code="body_too_large")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(
            400, f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_json"
        ) from None
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as e:
        raise APIError(400, f"malformed JSON in the request body: {e}", code="invalid_json") from None
    except RecursionError:  # [[[[...]]]] deeper than the parser's stack
        raise APIError(400, "the request body's JSON is nested too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    for name in REFUSED_FIELDS:
        if name in data:
            raise APIError(400, f"{name}: request-supplied chat templates are not accepted; the server uses "
                           "the model's own template", param=name, code="unsupported_parameter")
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    except RecursionError:
        raise APIError(400, "the request body's JSON is nested too deeply", code="invalid_json") from None
    if req.model_extra:
        name = sorted(req.model_extra)[0]
        raise APIError(400, f"{name}: this request field is not supported by edge-infer (the README lists the "
                       "fields it implements and the ones it accepts without effect)", param=name,
                       code="unsupported_parameter")
    limits.check(req)
    return req


def response_format(rf: dict[str, Any]) -> StructuredOutputsParams | None:
    """OpenAI's response_format: {"type": "text"} (no constraint), {"type": "json_object"}, or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}."""
    kind = rf.get("type")
    if kind == "text" and len(rf) == 1:
        return None
    if kind == "json_object" and len(rf) == 1:
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        js = rf.get("json_schema")
        extra = sorted(set(rf) - {"type", "json_schema"}) + sorted(set(js or {}) - {"name", "schema", "strict", "description"})
        if not isinstance(js, dict) or extra:
            raise APIError(400, "response_format.json_schema must be an object with name, schema, strict, description"
                           + (f" (unknown: {', '.join(extra)})" if extra else ""), param="response_format",
                           code="invalid_value")
        schema = js.get("schema", {"type": "object"})
        if not isinstance(schema, dict) or not isinstance(js.get("strict", False), bool):
            raise APIError(400, "response_format.json_schema.schema must be a JSON schema object and strict a boolean",
                           param="response_format", code="invalid_value")
        return StructuredOutputsParams(json=schema)  # always enforced: strict or not, the output matches
    raise APIError(400, "response_format.type must be text, json_object or json_schema (with nothing else), got "
                   f"{json.dumps(rf)[:120]}", param="response_format", code="invalid_value")


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    if not messages:
        raise APIError(400, "messages must hold at least one message", param="messages", code="invalid_value")
    out = []
    for i, m in enumerate(messages):
        if m.model_extra:
            name = sorted(m.model_extra)[0]
            raise APIError(400, f"messages[{i}].{name}: this message field is not supported by edge-infer",
                           param=f"messages[{i}].{name}", code="unsupported_parameter")
        if m.role not in ROLES:
            raise APIError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}",
                           param=f"messages[{i}].role", code="invalid_value")
        content = m.content
        if isinstance(content, list):
            for j, part in enumerate(content):
                ok = (part.type == "text" and part.text is not None and part.image_url is None
                      or part.type == "image_url" and part.image_url is not None and part.text is None)
                if not ok:
                    raise APIError(400, f"messages[{i}].content[{j}]: a content part must be text (with text) or "
                                   f"image_url (with image_url.url), got type {part.type!r}",
                                   param=f"messages[{i}].content", code="invalid_value")
            if any(p.type == "image_url" for p in content):  # kept as parts: chat_prompt places the images
                content = [{"type": "text", "text": p.text} if p.image_url is None  # type: ignore[misc]
                           else {"type": "image_url", "image_url": {"url": p.image_url.url}} for p in content]
            else:
                content = "\n".join(p.text or "" for p in content)
        if m.tool_calls is not None and m.role != "assistant":
            raise APIError(400, f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                           param=f"messages[{i}].tool_calls", code="invalid_value")
        for j, call in enumerate(m.tool_calls or ()):
            if not FUNCTION_NAME.fullmatch(call.function.name):  # the rule tools[].function.name keeps
                raise APIError(400, f"messages[{i}].tool_calls[{j}].function.name must be 1-64 letters, digits, _ . -",
                               param=f"messages[{i}].tool_calls[{j}].function.name", code="invalid_value")
        if m.role == "tool" and not m.tool_call_id:
            raise APIError(400, f"messages[{i}].tool_call_id is required for role 'tool'",
                           param=f"messages[{i}].tool_call_id", code="missing_required_parameter")
        if content is None and m.role != "assistant":
            raise APIError(400, f"messages[{i}].content is required for role {m.role!r}",
                           param=f"messages[{i}].content", code="invalid_value")
        msg: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": content or "",
        }
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _validation_error(e: ValidationError) -> APIError:
    err = e.errors()[0]
    loc = [p for p in err["loc"] if isinstance(p, int) or ("[" not in p and p not in _TYPE_TAGS)]
    path = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(loc))
    if err["type"] == "missing":
        return APIError(400, f"{path} is required", param=path or None, code="missing_required_parameter")
    got = err.get("input")
    shown = (
        json.dumps(got)[:80] if isinstance(got, (str, int, float, bool, type(None))) else type(got).__name__
    )
    return APIError(400, f"{path}: {err['msg']} (got {shown})", param=path or None, code="invalid_type")


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "ContentPart", "StreamOptions", "ToolCall",
              "ToolCallFunction", "LoraEntry"}


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")

