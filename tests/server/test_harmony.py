"""gpt-oss's harmony replies (server/harmony.py): the real template from the oracle's source tree
is recognised; written replies split into reasoning (analysis), content (final, commentary
preambles) and tool calls (commentary to functions.NAME, with the recipient before or after the
channel); streamed char by char the deltas add up to the whole split; a call rendered into the
history by the real template parses back; the grammar for "required" admits exactly a call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llama_templates import template

from edge_infer.chat import ChatTemplate
from edge_infer.engine.structured import GrammarCompiler
from edge_infer.sampling_params import StructuredOutputsParams
from edge_infer.server.harmony import is_harmony, parse
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.tools import ToolPlan, detect_format, template_history, tool_grammar
from edge_infer.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
REPLIES = [
    (f"{THINK}<|channel|>final<|message|>It is sunny.", "The user wants the weather.", "It is sunny.", []),
    (f"{THINK}<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{{\"city\": \"Paris\"}}",
     "The user wants the weather.", "", [("get_weather", {"city": "Paris"})]),
    (f"{THINK} to=functions.get_weather<|channel|>commentary json<|message|>{{\"city\": \"Oslo\"}}",
     "The user wants the weather.", "", [("get_weather", {"city": "Oslo"})]),
    ("<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
     None, "Let me look.Done.", []),
]


def test_the_real_template_is_harmony() -> None:
    source = template("openai-gpt-oss-120b")
    assert is_harmony(source) and detect_format(source) == "harmony"
    assert not is_harmony(template("Qwen3-Coder"))


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), REPLIES)
def test_whole_and_streamed_replies_split_alike(text: str, reasoning: str | None, content: str, calls: list) -> None:  # type: ignore[type-arg]
    r, c, found = parse(text)
    assert (r, c, found) == (reasoning, content, calls)
    shaper = ReplyShaper(ToolPlan(TOOLS, "auto", None, True, "harmony"), False, False, harmony=True)
    message, finish = shaper.message(text, "stop")
    assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in message.get("tool_calls", [])] == calls
    assert finish == ("tool_calls" if calls else "stop") and message.get("reasoning_content") == reasoning
    stream, parts, got_calls = shaper.stream(), {"reasoning_content": "", "content": ""}, []
    for i in range(1, len(text) + 1):
        delta, _ = stream.step(text[:i], i == len(text), "stop" if i == len(text) else None)
        for key in parts:
            parts[key] += delta.get(key, "")
        got_calls += delta.get("tool_calls", [])
    assert (parts["reasoning_content"] or None, parts["content"]) == (reasoning, content)
    assert len(got_calls) == len(calls)


def test_a_call_rendered_by_the_real_template_parses_back() -> None:
    t = ChatTemplate(template("openai-gpt-oss-120b"))
    history = template_history([{"role": "user", "content": "Weather?"},
                                {"role": "assistant", "content": "", "tool_calls": [
                                    {"id": "c1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}])
    text = t.render(history, add_generation_prompt=False, tools=TOOLS)
    reply = text[text.rindex("Weather?<|end|>") + len("Weather?<|end|>"):]
    assert parse(reply)[2] == [("get_weather", {"city": "Paris"})], reply


def test_the_grammar_admits_exactly_a_call(smollm2_path: Path) -> None:
    import llguidance

    tok = Tokenizer.from_gguf(smollm2_path)
    compiler = GrammarCompiler(tok, tuple(sorted(tok.stop_ids)), tok.vocab_size)
    grammar = tool_grammar(ToolPlan(TOOLS, "required", None, True, "harmony"), {})
    assert grammar is not None
    compiler.processors(StructuredOutputsParams(grammar=grammar), 1)
    matcher = llguidance.LLMatcher(compiler._lltokenizer(), llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    good = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}'
    for text, ok in ((good, True), ("<|channel|>final<|message|>Hi", False)):
        m = matcher.deep_copy()
        ids = tok.encode(text, add_special=False)
        assert (m.try_consume_tokens(ids) == len(ids) and m.is_accepting()) == ok, text
        if ok:
            assert parse(text)[2] == [("get_weather", {"city": "Rome"})]


# a template of our own in harmony's shape (the tiny model's vocabulary has no harmony tokens,
# so the channels are plain text here: the route's split is what is checked)
HARMONY = ("{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
           "{% if add_generation_prompt %}<|start|>assistant{% endif %}{# <|channel|> #}")
FORCED = ('root ::= "<|channel|>analysis<|message|>" [a-z ]{3,12} "<|end|><|start|>assistant<|channel|>final<|message|>" '
          '[a-z]{2,8}')


@pytest.mark.slow
def test_the_chat_route_splits_harmony_channels(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import httpx
    from arch_models import write_arch_model

    path = write_arch_model(tmp_path / "m.gguf", "llama", chat_template=HARMONY, context_length=512)
    srv = start_server(path, "-t", "1", "--kv-cache-memory", "8MiB")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 300, "temperature": 0, "guided_grammar": FORCED}
    msg = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"] and "<|" not in msg["reasoning_content"] + msg["content"], msg
