"""Tool-call formats without a server: detection from templates we write, parsing of replies
in the Hermes/Qwen, Llama 3.x and Mistral shapes (plain text that is not a call stays content),
the streaming hold-back, the grammars for "required" and a named function (they compile and
admit exactly the calls), and the history handed to a real template with arguments as objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_infer.chat import ChatTemplate
from edge_infer.engine.structured import GrammarCompiler
from edge_infer.sampling_params import StructuredOutputsParams
from edge_infer.server.errors import APIError
from edge_infer.server.tools import (
    ToolPlan,
    detect_format,
    parse_tool_calls,
    plan_tools,
    stream_safe_prefix,
    template_history,
    tool_grammar,
)
from edge_infer.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]

# small templates of our own, each teaching one format
TEMPLATES = {
    "hermes": "{% for m in messages %}{{ m.content }}{% endfor %}Call tools as <tool_call>{...}</tool_call>",
    "llama3_json": "{% if tools %}Environment: ipython{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "mistral": "{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}Use [TOOL_CALLS] to call.",
}


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_detect_format(fmt: str) -> None:
    assert detect_format(TEMPLATES[fmt]) == fmt
    assert detect_format("{{ messages[0].content }}") is None


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
     "Sure.", [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo; Norway"}}; '
                    '{"name": "add", "parameters": {"a": 3, "b": 4}}',
     None, [("get_weather", {"city": "Oslo; Norway"}), ("add", {"a": 3, "b": 4})]),
    ("llama3_json", '{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [("add", {"a": 1, "b": 2})]),
    ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 5, "b": 6}}]', None, [("add", {"a": 5, "b": 6})]),
    ("hermes", "No tools needed: the answer is 4.", "No tools needed: the answer is 4.", []),
    ("hermes", '<tool_call>\n{"name": broken json}\n</tool_call>', '<tool_call>\n{"name": broken json}\n</tool_call>', []),
    ("llama3_json", "The JSON {a} is not a call.", "The JSON {a} is not a call.", []),
], ids=["hermes-two", "llama3-two", "llama3-bare", "mistral", "no-call", "broken", "llama3-text"])
def test_parse(fmt: str, text: str, content: str | None, calls: list) -> None:
    got_content, got = parse_tool_calls(text, fmt)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)


def test_stream_hold_back() -> None:
    assert stream_safe_prefix("Hello <tool_", "hermes") == len("Hello ")
    assert stream_safe_prefix("Hello <tool_call>\n{", "hermes") == len("Hello ")
    assert stream_safe_prefix("Hello there", "hermes") == len("Hello there")
    assert stream_safe_prefix("[TOOL", "mistral") == 0
    assert stream_safe_prefix('{"name"', "llama3_json") == 0
    assert stream_safe_prefix("Plain answer", "llama3_json") == len("Plain answer")


def test_plan_validation() -> None:
    assert plan_tools(None, None, None, "hermes") is None
    p = plan_tools(TOOLS, {"type": "function", "function": {"name": "add"}}, False, "hermes")
    assert p is not None and (p.choice, p.function, p.parallel) == ("function", "add", False)
    assert plan_tools(TOOLS, "none", None, None).tools == []  # type: ignore[union-attr]
    for tools, choice, param in ((TOOLS, "sometimes", "tool_choice"), ([{"type": "function"}], None, "tools[0]"),
                                 (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
                                 (None, "required", "tool_choice"), (TOOLS + TOOLS[:1], None, "tools")):
        with pytest.raises(APIError) as e:
            plan_tools(tools, choice, None, "hermes")
        assert e.value.param == param
    with pytest.raises(APIError, match="no tool-call format"):
        plan_tools(TOOLS, "auto", None, None)


@pytest.fixture(scope="module")
def compiler(smollm2_path: Path) -> GrammarCompiler:
    tok = Tokenizer.from_gguf(smollm2_path)
    return GrammarCompiler(tok, tuple(sorted(tok.stop_ids)), tok.vocab_size)


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
@pytest.mark.parametrize("choice", ["required", "function"])
def test_grammars_admit_exactly_the_calls(fmt: str, choice: str, compiler: GrammarCompiler) -> None:
    import llguidance

    plan = ToolPlan(TOOLS, choice, "add" if choice == "function" else None, True, fmt)
    grammar = tool_grammar(plan, {})
    assert grammar is not None
    (proc,) = compiler.processors(StructuredOutputsParams(grammar=grammar), 1)  # compiles
    ll = compiler._lltokenizer()
    matcher = llguidance.LLMatcher(ll, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    add = '{"name": "add", "arguments": {"a": 1, "b": 2}}'.replace("arguments", "parameters" if fmt == "llama3_json" else "arguments")
    weather = '{"name": "get_weather", "arguments": {"city": "Rome"}}'.replace("arguments", "parameters" if fmt == "llama3_json" else "arguments")
    wrap = {"hermes": lambda c: f"<tool_call>\n{c}\n</tool_call>", "mistral": lambda c: f"[TOOL_CALLS][{c}]",
            "llama3_json": lambda c: c}[fmt]
    for text, ok in ((wrap(add), True), (wrap(weather), choice == "required"), ("The answer is 3.", False)):
        m = matcher.deep_copy()
        ids = compiler._tokenizer.encode(text, add_special=False)
        accepted = m.try_consume_tokens(ids) == len(ids) and m.is_accepting()
        assert accepted == ok, (fmt, choice, text)


def test_history_reaches_the_template_with_object_arguments(qwen2_1p5b_path: Path) -> None:
    t = ChatTemplate.from_gguf(qwen2_1p5b_path)
    msgs = template_history([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    ])
    text = t.render(msgs, tools=TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in text and '"name": "add"' in text
