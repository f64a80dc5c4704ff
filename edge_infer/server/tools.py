"""Tool calling in OpenAI's shape over the formats model families emit, told apart by the chat
template: Hermes / Qwen (`<tool_call>{"name", "arguments"}</tool_call>`, one block per call),
Llama 3.x (a JSON object `{"name", "parameters"}`, optionally after `<|python_tag|>`, several
joined by `;`) and Mistral (`[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`); the
newer families' (Qwen3-Coder's XML, DeepSeek's, pythonic) in tool_formats.py, gpt-oss's harmony
channels in harmony.py.

`tools` are validated and handed to the template; `tool_choice` "required" or a named function
is enforced by a grammar for the family's format (so the call always parses); "none" leaves
the tools out of the prompt. Assistant `tool_calls` and `tool` messages in the history go to
the template with the arguments as objects (what templates expect).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from edge_infer.server import harmony
from edge_infer.server.errors import APIError
from edge_infer.server.tool_formats import MARKERS as NEW_MARKERS
from edge_infer.server.tool_formats import (
    NEW_FORMATS,
    detect_new_format,
    new_grammar,
    new_safe_prefix,
    parse_new,
)

FORMATS = ("hermes", "llama3_json", "mistral", *NEW_FORMATS, "harmony")
# llguidance's JSON style inside a grammar: as the models write it, no free whitespace
_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
# a function name, in tools and in the history's tool calls (OpenAI's rule)
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def detect_format(template: str | None) -> str | None:
    """The tool-call format a chat template teaches its model, or None (no tool support)."""
    if not template:
        return None
    if harmony.is_harmony(template):
        return "harmony"
    newer = detect_new_format(template)
    if newer is not None:
        return newer
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "ipython" in template:
        return "llama3_json"
    return None


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools mean for its prompt and its output."""

    tools: list[dict[str, Any]]  # validated, OpenAI shape, for the template ([] when not rendered)
    choice: str  # "auto" | "none" | "required" | "function"
    function: str | None  # the named function for choice "function"
    parallel: bool
    fmt: str | None


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel: bool | None, fmt: str | None) -> ToolPlan | None:
    """Validate tools / tool_choice / parallel_tool_calls (400s name the field); None when the
    request has no tools."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice", code="invalid_value")
        return None
    if not isinstance(tools, list) or not tools:
        raise APIError(400, "tools must be a non-empty list", param="tools", code="invalid_value")
    names = []
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(f, dict) or set(t) - {"type", "function"}:
            raise APIError(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}",
                           param=f"tools[{i}]", code="invalid_value")
        if not isinstance(f.get("name"), str) or not FUNCTION_NAME.fullmatch(f["name"]):
            raise APIError(400, f"tools[{i}].function.name must be 1-64 letters, digits, _ . -", param=f"tools[{i}].function.name",
                           code="invalid_value")
        extra = set(f) - {"name", "description", "parameters", "strict"}
        if extra or not isinstance(f.get("parameters", {}), dict):
            raise APIError(400, f"tools[{i}].function: parameters must be a JSON schema object"
                           + (f"; unknown {', '.join(sorted(extra))}" if extra else ""), param=f"tools[{i}].function",
                           code="invalid_value")
        names.append(f["name"])
    if len(set(names)) != len(names):
        raise APIError(400, "tools: function names must be unique", param="tools", code="invalid_value")
    choice, function = "auto", None
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        choice = tool_choice or "auto"
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict) and tool_choice["function"].get("name") in names:
        choice, function = "function", tool_choice["function"]["name"]
    else:
        raise APIError(400, "tool_choice must be auto, none, required or {\"type\": \"function\", \"function\": "
                       "{\"name\": <one of the tools>}}", param="tool_choice", code="invalid_value")
    if choice != "none" and fmt is None:
        raise APIError(400, "tools: this model's chat template has no tool-call format edge-infer knows (Hermes/Qwen, "
                       "Llama 3.x, Mistral, Qwen3-Coder, DeepSeek, pythonic, gpt-oss harmony)", param="tools", code="unsupported_parameter")
    return ToolPlan(tools if choice != "none" else [], choice, function, parallel is not False, fmt)


def template_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool_calls with their arguments as objects (templates print them with tojson)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": _as_object(c["function"]["arguments"])}}
                                     for c in calls]}
        out.append(m)
    return out


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _call_schema(tool: dict[str, Any], args_key: str) -> dict[str, Any]:
    f = tool["function"]
    return {"type": "object", "properties": {"name": {"const": f["name"]}, args_key: f.get("parameters") or {"type": "object"}},
            "required": ["name", args_key], "additionalProperties": False}


def tool_grammar(plan: ToolPlan, special: dict[str, int]) -> str | None:
    """A Lark grammar (llguidance's dialect) that admits only tool calls in the plan's format,
    for choice "required" (any tools, at least one call) or "function" (that one); None for
    auto / none. `special`: marker text -> id, for markers that are one token of the vocabulary
    (the model writes them as that token)."""
    if plan.choice not in ("required", "function"):
        return None
    tools = [t for t in plan.tools if plan.choice == "required" or t["function"]["name"] == plan.function]
    args_key = "parameters" if plan.fmt == "llama3_json" else "arguments"
    schema = {"anyOf": [_call_schema(t, args_key) for t in tools], "x-guidance": _STYLE}
    call_json = "%json " + json.dumps(schema)

    def lit(text: str) -> str:
        return f"<[{special[text]}]>" if text in special else json.dumps(text)

    # a named function: one call; "required": at most one call per tool (a small model asked
    # for "one or more" can repeat calls until max_tokens)
    n_calls = len(tools) if plan.choice == "required" and plan.parallel else 1
    if plan.fmt in NEW_FORMATS:
        return new_grammar(plan.fmt or "", tools, n_calls, lit)
    if plan.fmt == "harmony":
        return harmony.grammar(tools, lit)

    def calls(sep: str) -> str:
        rule = "call"
        for _ in range(n_calls - 1):
            rule = f"call ({json.dumps(sep)} {rule})?"
        return rule

    if plan.fmt == "hermes":
        call = f'{lit("<tool_call>")} "\\n" {call_json} "\\n" {lit("</tool_call>")}'
        return f"start: {calls(chr(10))}\ncall: {call}\n"
    if plan.fmt == "mistral":
        return f'start: {lit("[TOOL_CALLS]")} "[" {calls(", ")} "]"\ncall: {call_json}\n'
    return f"start: {calls('; ')}\ncall: {call_json}\n"


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str, fmt: str | None, tools: list[dict[str, Any]] | None = None
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) from a reply: calls as OpenAI's {"id", "type", "function": {"name",
    "arguments" (JSON text)}}; content the text around them (None when empty). Text that is
    not a well-formed call stays content. tools: the request's (their schemas type the values
    of formats that write them as text)."""
    found: list[tuple[str, Any]] = []
    content = text
    if fmt in NEW_FORMATS:
        schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or ()}
        content, found = parse_new(text, fmt or "", schemas)
    elif fmt == "harmony":
        _, content, found = harmony.parse(text)
    elif fmt == "hermes":
        for m in _HERMES.finditer(text):
            obj = _loads(m.group(1))
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                found.append((obj["name"], obj.get("arguments", {})))
        if found:
            content = _HERMES.sub("", text)
    elif fmt == "mistral" and "[TOOL_CALLS]" in text:
        head, _, tail = text.partition("[TOOL_CALLS]")
        obj = _loads(tail.strip())
        if isinstance(obj, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in obj):
            found = [(c["name"], c.get("arguments", {})) for c in obj]
            content = head
    elif fmt == "llama3_json":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        parts = [_loads(p) for p in _split_top_level(body, ";")] if body.startswith("{") else []
        if parts and all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in parts):
            found = [(p["name"], p.get("parameters", p.get("arguments", {}))) for p in parts]
            content = ""
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
              "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}} for name, args in found]
    rest = content.strip()
    return (rest or None) if calls else text, calls


def _loads(s: str) -> Any:
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return None


def _split_top_level(s: str, sep: str) -> list[str]:
    """s split at sep outside JSON strings, objects and lists."""
    parts, depth, start, in_str, esc = [], 0, 0, False, False
    for i, ch in enumerate(s):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(s[start:i].strip())
            start = i + 1
    parts.append(s[start:].strip())
    return [p for p in parts if p]


MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", *NEW_MARKERS, *harmony.MARKERS)


def stream_safe_prefix(text: str, fmt: str | None) -> int:
    """How much of a partial reply can be streamed as content: up to where a tool call starts
    (or might start: a marker's prefix at the end is held back). A Llama 3.x reply that opens
    with "{" or <|python_tag|> is a call until it ends."""
    if fmt in NEW_FORMATS:
        return new_safe_prefix(text, fmt or "")
    if fmt == "llama3_json":
        head = text.lstrip()[:14]
        return 0 if not head or head[0] == "{" or "<|python_tag|>".startswith(head) or head == "<|python_tag|>" else len(text)
    marker = "<tool_call>" if fmt == "hermes" else "[TOOL_CALLS]"
    at = text.find(marker)
    if at >= 0:
        return at
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return len(text) - k
    return len(text)
