"""The tool-call formats of newer model families (tools.py has Hermes, Llama 3.x JSON, Mistral):

- `qwen3_coder` (Qwen3-Coder, Qwen3.5): `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE
  \\n</parameter>\\n...</function>\\n</tool_call>`; a value is text, read as its parameter's
  schema type says (a string stays as written; numbers, booleans, arrays and objects are parsed:
  JSON, or Python's True / False / None as the template writes them).
- `deepseek` (DeepSeek V3.1 and later; R1's older form too): `<｜tool▁calls▁begin｜>` then per
  call `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}<｜tool▁call▁end｜>` (R1: `function<｜tool▁sep｜>NAME`
  and the JSON in a ```json fence), then `<｜tool▁calls▁end｜>`.
- `pythonic` (Llama 3.2 / 4's pythonic templates): the whole reply `[f(a=1, b="x"), g()]`, read
  with Python's `ast` (literals only; JSON's true / false / null too).

Each has its grammar for tool_choice "required" / a named function, built from the tools'
schemas (there a qwen3_coder string value is one line without "<": the grammar's one restriction).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

NEW_FORMATS = ("qwen3_coder", "deepseek", "pythonic")
DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_SEP, DS_CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
MARKERS = (DS_BEGIN, DS_END, DS_CALL, DS_SEP, DS_CALL_END)
_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def detect_new_format(template: str) -> str | None:
    """The newer format a chat template teaches, or None."""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "tool▁calls▁begin" in template:
        return "deepseek"
    if "[func_name1(" in template or "func_name1(params_name1" in template:
        return "pythonic"
    return None


# -- parsing ------------------------------------------------------------------------------------

_QC_CALL = re.compile(r"(?:<tool_call>\s*)?<function=([^>\n]+)>(.*?)</function>(?:\s*</tool_call>)?", re.S)
_QC_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_DS_CALL = re.compile(re.escape(DS_CALL) + r"(.*?)" + re.escape(DS_SEP) + r"(.*?)" + re.escape(DS_CALL_END), re.S)
_FENCE = re.compile(r"^\s*([^\n`]*)\n```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def parse_new(text: str, fmt: str, schemas: dict[str, dict[str, Any]]) -> tuple[str, list[tuple[str, Any]]]:
    """(content left, [(name, arguments object)]) of a reply in `fmt`; schemas: each tool's
    parameters schema by name (qwen3_coder's values are typed by it)."""
    if fmt == "qwen3_coder":
        found = [(m.group(1).strip(), _qc_args(m.group(2), schemas.get(m.group(1).strip(), {})))
                 for m in _QC_CALL.finditer(text)]
        return (_QC_CALL.sub("", text) if found else text), found
    if fmt == "deepseek":
        head, sep, tail = text.partition(DS_BEGIN)
        if not sep:
            return text, []
        found = []
        for m in _DS_CALL.finditer(tail):
            name, args = _ds_call(m.group(1), m.group(2))
            if name is None:
                return text, []
            found.append((name, args))
        return head, found
    body = text.strip()
    calls = _pythonic(body) if body.startswith("[") and body.endswith("]") else None
    return ("", calls) if calls else (text, [])


def _qc_args(body: str, schema: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for m in _QC_PARAM.finditer(body):
        key, raw = m.group(1).strip(), m.group(2)
        kind = _property(schema, key).get("type")
        args[key] = raw if kind == "string" else _literal(raw)
    return args


def _property(schema: dict[str, Any], key: str) -> dict[str, Any]:
    """A parameter's schema ({} when the tool's schema does not say)."""
    props = schema.get("properties")
    sub = props.get(key) if isinstance(props, dict) else None
    return sub if isinstance(sub, dict) else {}


def _literal(raw: str) -> Any:
    """A value as written: JSON, else a Python literal (True, None, 'x'), else the text."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw


def _ds_call(head: str, body: str) -> tuple[str | None, Any]:
    name, raw = head.strip(), body.strip()
    if name == "function":  # R1's form: the name on the first line, then a ```json fence
        m = _FENCE.match(raw)
        if m is None:
            return None, None
        name, raw = m.group(1).strip(), m.group(2)
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        return None, None
    return (name, args) if name and isinstance(args, dict) else (None, None)


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _pythonic(body: str) -> list[tuple[str, Any]] | None:
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, (ast.Name, ast.Attribute)):
            return None
        name = ast.unparse(node.func)
        args = {}
        for kw in node.keywords:
            if kw.arg is None:
                return None
            value = _py_value(kw.value)
            if value is _NOT:
                return None
            args[kw.arg] = value
        calls.append((name, args))
    return calls


_NOT = object()


def _py_value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_py_value(e) for e in node.elts]
        return _NOT if any(i is _NOT for i in items) else items
    if isinstance(node, ast.Dict):
        keys = [_py_value(k) if k is not None else _NOT for k in node.keys]
        values = [_py_value(v) for v in node.values]
        if any(x is _NOT for x in keys + values) or not all(isinstance(k, (str, int, float, bool)) for k in keys):
            return _NOT
        return dict(zip(keys, values))
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _NOT


def new_safe_prefix(text: str, fmt: str) -> int:
    """How much of a partial reply can stream as content (up to where a call starts, a marker's
    prefix at the end held back); a pythonic reply that opens with "[" is a call until it ends."""
    if fmt == "pythonic":
        head = text.lstrip()
        return 0 if not head or head[0] == "[" else len(text)
    markers = ("<tool_call>", "<function=") if fmt == "qwen3_coder" else (DS_BEGIN,)
    cut = len(text)
    for marker in markers:
        at = text.find(marker)
        if at >= 0:
            cut = min(cut, at)
            continue
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-k:]):
                cut = min(cut, len(text) - k)
                break
    return cut


# -- grammars for "required" / a named function --------------------------------------------------

def new_grammar(fmt: str, tools: list[dict[str, Any]], n_calls: int, lit: Any) -> str:
    """A Lark grammar (llguidance's dialect) admitting 1..n_calls calls of `tools` in `fmt`;
    lit(text) writes a marker as its single token where it is one."""
    rules = [f"call_{i}" for i in range(len(tools))]
    lines = [f"call: {' | '.join(rules)}"]
    for rule, tool in zip(rules, tools):
        f = tool["function"]
        params = f.get("parameters") or {"type": "object"}
        if fmt == "qwen3_coder":
            lines.append(f"{rule}: {_qc_call(f['name'], params, lit, rule)}")
            lines.extend(_qc_values(params, rule))
        elif fmt == "deepseek":
            lines.append(f'{rule}: {lit(DS_CALL)} {json.dumps(f["name"])} {lit(DS_SEP)} %json {_schema(params)} {lit(DS_CALL_END)}')
        else:
            lines.append(f"{rule}: {json.dumps(f['name'] + '(')} {_py_kwargs(params, rule, lines)} \")\"")
    seq = "call"
    sep = {"qwen3_coder": '"\\n"', "deepseek": "", "pythonic": '", "'}[fmt]
    for _ in range(n_calls - 1):
        seq = f"call ({sep} {seq})?"
    start = {"qwen3_coder": seq, "deepseek": f"{lit(DS_BEGIN)} {seq} {lit(DS_END)}", "pythonic": f'"[" {seq} "]"'}[fmt]
    return "\n".join([f"start: {start}", *lines]) + "\n"


def _schema(params: dict[str, Any]) -> str:
    return json.dumps({**params, "x-guidance": _STYLE})


def _qc_call(name: str, params: dict[str, Any], lit: Any, rule: str) -> str:
    parts = [lit("<tool_call>"), json.dumps(f"\n<function={name}>\n")]
    for j, key in enumerate(_keys(params)):
        parts.append(json.dumps(f"<parameter={key}>\n") + f" {rule}_v{j} " + json.dumps("\n</parameter>\n"))
    parts += [json.dumps("</function>\n"), lit("</tool_call>")]
    return " ".join(parts)


def _qc_values(params: dict[str, Any], rule: str) -> list[str]:
    out = []
    for j, key in enumerate(_keys(params)):
        sub = _property(params, key)
        value = "/[^<\\n]*/" if sub.get("type") == "string" else f"%json {_schema(sub)}"
        out.append(f"{rule}_v{j}: {value}")
    return out


def _keys(params: dict[str, Any]) -> list[str]:
    """The parameters a call writes: the required ones (all of them when none is marked)."""
    props = params.get("properties")
    props = props if isinstance(props, dict) else {}
    required = params.get("required")
    named = [k for k in required if isinstance(k, str) and k in props] if isinstance(required, list) else []
    return named or [k for k in props if isinstance(k, str)]


def _py_kwargs(params: dict[str, Any], rule: str, lines: list[str]) -> str:
    parts = []
    for j, key in enumerate(_keys(params)):
        sub = _property(params, key)
        lines.append(f"{rule}_v{j}: %json {_schema(sub)}")
        parts.append((json.dumps(", ") + " " if j else "") + json.dumps(f"{key}=") + f" {rule}_v{j}")
    return " ".join(parts) if parts else '""'
