"""The newer tool-call formats (server/tool_formats.py): Qwen3-Coder's XML, DeepSeek's (V3.1 and
R1 forms) and pythonic calls, detected from the real templates in the oracle's source tree,
parsed from written replies (values typed by the tool's schema), round-tripped through the real
template (a call rendered into the history parses back to itself), streamed without leaking a
call's start, and held to the calls by their grammars for "required" and a named function."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_templates import template

from edge_infer.chat import ChatTemplate
from edge_infer.engine.structured import GrammarCompiler
from edge_infer.sampling_params import StructuredOutputsParams
from edge_infer.server.tool_formats import DS_BEGIN, DS_CALL, DS_CALL_END, DS_END, DS_SEP
from edge_infer.server.tools import (
    ToolPlan,
    detect_format,
    parse_tool_calls,
    stream_safe_prefix,
    template_history,
    tool_grammar,
)
from edge_infer.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "set_alarm", "parameters": {
             "type": "object", "properties": {"on": {"type": "boolean"}, "tags": {"type": "array"}},
             "required": ["on", "tags"]}}}]
PYTHONIC = "{% for m in messages %}{{ m.content }}{% endfor %}Reply as [func_name1(params_name1=params_value1)]"


@pytest.mark.parametrize(("name", "fmt"), [("Qwen3-Coder", "qwen3_coder"), ("deepseek-ai-DeepSeek-V3.1", "deepseek"),
                                           ("llama-cpp-deepseek-r1", "deepseek"), ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
                                           ("mistralai-Mistral-Nemo-Instruct-2407", "mistral")])
def test_detected_from_the_real_templates(name: str, fmt: str) -> None:
    assert detect_format(template(name)) == fmt
    assert detect_format(PYTHONIC) == "pythonic"


def _calls(text: str, fmt: str) -> tuple[str | None, list[tuple[str, Any]]]:
    content, calls = parse_tool_calls(text, fmt, TOOLS)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    ("qwen3_coder", "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n007 Paris\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=set_alarm>\n"
                    "<parameter=on>\nTrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n</function>\n"
                    "</tool_call>",
     "Let me check.", [("get_weather", {"city": "007 Paris", "days": 3}), ("set_alarm", {"on": True, "tags": ["a", "b"]})]),
    ("deepseek", f"Sure.{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{\"city\": \"Oslo\"}}{DS_CALL_END}"
                 f"{DS_CALL}set_alarm{DS_SEP}{{\"on\": false, \"tags\": []}}{DS_CALL_END}{DS_END}",
     "Sure.", [("get_weather", {"city": "Oslo"}), ("set_alarm", {"on": False, "tags": []})]),
    ("deepseek", f"{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n```json\n{{\"city\": \"Rome\"}}\n```{DS_CALL_END}{DS_END}",
     None, [("get_weather", {"city": "Rome"})]),
    ("pythonic", '[get_weather(city="Lima", days=2), set_alarm(on=True, tags=["x"])]', None,
     [("get_weather", {"city": "Lima", "days": 2}), ("set_alarm", {"on": True, "tags": ["x"]})]),
    ("pythonic", "[set_alarm(on=false, tags=[null])]", None, [("set_alarm", {"on": False, "tags": [None]})]),
    ("pythonic", "[1, 2] is a list, not a call.", "[1, 2] is a list, not a call.", []),
    ("pythonic", "[get_weather(__import__('os'))]", "[get_weather(__import__('os'))]", []),
    ("deepseek", f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{broken{DS_CALL_END}{DS_END}",
     f"{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{broken{DS_CALL_END}{DS_END}", []),
    ("qwen3_coder", "No call here: <function is a word.", "No call here: <function is a word.", []),
], ids=["qwen3-two", "deepseek-two", "deepseek-r1", "pythonic-two", "pythonic-json-names", "pythonic-list",
        "pythonic-positional", "deepseek-broken", "qwen3-text"])
def test_parse(fmt: str, text: str, content: str | None, calls: list) -> None:  # type: ignore[type-arg]
    assert _calls(text, fmt) == (content, calls)


@pytest.mark.parametrize(("name", "fmt"), [("Qwen3-Coder", "qwen3_coder"), ("deepseek-ai-DeepSeek-V3.1", "deepseek")])
def test_a_call_rendered_by_the_real_template_parses_back(name: str, fmt: str) -> None:
    t = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    args = {"city": "Paris", "days": 2}
    history = template_history([{"role": "user", "content": "Weather?"},
                                {"role": "assistant", "content": "", "tool_calls": [
                                    {"id": "c1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": json.dumps(args)}}]}])
    text = t.render(history, add_generation_prompt=False, tools=TOOLS)
    reply = text[text.rindex("Weather?") + len("Weather?"):]
    assert _calls(reply, fmt)[1] == [("get_weather", args)], reply


@pytest.mark.parametrize(("fmt", "text", "start"), [
    ("qwen3_coder", "Checking.\n<tool_call>\n<function=get_weather>", "<tool_call>"),
    ("qwen3_coder", "Checking.\n<tool_", "<tool_"),
    ("deepseek", f"Sure.{DS_BEGIN}{DS_CALL}get", DS_BEGIN),
    ("pythonic", "[get_weather(city=", "["),
])
def test_streaming_holds_back_a_call(fmt: str, text: str, start: str) -> None:
    assert stream_safe_prefix(text, fmt) == text.index(start)
    assert stream_safe_prefix("Plain words.", fmt) == len("Plain words.")


@pytest.fixture(scope="module")
def compiler(smollm2_path: Path) -> GrammarCompiler:
    tok = Tokenizer.from_gguf(smollm2_path)
    return GrammarCompiler(tok, tuple(sorted(tok.stop_ids)), tok.vocab_size)


WRITTEN = {
    "qwen3_coder": ("<tool_call>\n<function=set_alarm>\n<parameter=on>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\"]\n"
                    "</parameter>\n</function>\n</tool_call>",
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"),
    "deepseek": (f'{DS_BEGIN}{DS_CALL}set_alarm{DS_SEP}{{"on": true, "tags": ["a"]}}{DS_CALL_END}{DS_END}',
                 f'{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Rome"}}{DS_CALL_END}{DS_END}'),
    "pythonic": ('[set_alarm(on=true, tags=["a"])]', '[get_weather(city="Rome")]'),
}


@pytest.mark.parametrize("fmt", list(WRITTEN))
@pytest.mark.parametrize("choice", ["required", "function"])
def test_grammars_admit_exactly_the_calls(fmt: str, choice: str, compiler: GrammarCompiler) -> None:
    import llguidance

    plan = ToolPlan(TOOLS, choice, "set_alarm" if choice == "function" else None, True, fmt)
    grammar = tool_grammar(plan, {})
    assert grammar is not None
    compiler.processors(StructuredOutputsParams(grammar=grammar), 1)  # compiles
    matcher = llguidance.LLMatcher(compiler._lltokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    alarm, weather = WRITTEN[fmt]
    for text, ok in ((alarm, True), (weather, choice == "required"), ("The answer is 3.", False)):
        m = matcher.deep_copy()
        ids = compiler._tokenizer.encode(text, add_special=False)
        accepted = m.try_consume_tokens(ids) == len(ids) and m.is_accepting()
        assert accepted == ok, (fmt, choice, text, grammar)
        if ok:
            assert _calls(text, fmt)[1], text  # what the grammar admits parses
