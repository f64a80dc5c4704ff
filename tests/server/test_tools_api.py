"""Tool calling through the server on the real qwen2.5-coder-0.5b (the smallest of our models that
gets these right; the 1.5B took 4x the CI time for the same checks) with the official `openai`
client: a round trip (the model calls get_weather, the result goes back, the answer uses it);
tool_choice "required" always gives a valid call; streamed tool-call deltas assemble into the
calls of the same request unstreamed; parallel_tool_calls false keeps one call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

KEY = "sk-test-tools"
MODEL = "qwen2.5-coder-0.5b"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                           "b": {"type": "integer"}},
                                                          "required": ["a", "b"]}}}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def client(start_server, qwen2_path: Path):  # type: ignore[no-untyped-def]
    srv = start_server(qwen2_path, "-t", "2", "--kv-cache-memory", "128MiB", "--max-model-len", "2048",
                       "--api-key", KEY)
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=600)


def _calls(message) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_round_trip(client) -> None:  # type: ignore[no-untyped-def]
    first = client.chat.completions.create(model=MODEL, messages=WEATHER, tools=TOOLS, temperature=0, max_tokens=64,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and _calls(choice.message) == [("get_weather", {"city": "Paris"})]
    call = choice.message.tool_calls[0]
    history = WEATHER + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id,
                          "content": json.dumps({"temperature_celsius": 31, "sky": "sunny"})}]
    final = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                           temperature=0, max_tokens=64)
    answer = final.choices[0].message.content
    assert final.choices[0].finish_reason == "stop" and "31" in answer, answer


@pytest.mark.parametrize("question", ["Add 17 and 25.", "Is it raining in Tokyo?", "Tell me a joke.", "What is 2 + 2?"])
def test_required_always_gives_a_valid_call(client, question: str) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}], tools=TOOLS,
                                       tool_choice="required", temperature=0.8, seed=1, max_tokens=96)
    calls = _calls(r.choices[0].message)
    assert r.choices[0].finish_reason == "tool_calls" and calls
    for name, args in calls:
        params = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
        assert set(params["required"]) <= set(args) <= set(params["properties"])


def test_stream_assembles_the_same_calls_and_parallel_false(client) -> None:  # type: ignore[no-untyped-def]
    kw = dict(model=MODEL, messages=WEATHER, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96)
    whole = client.chat.completions.create(**kw).choices[0].message
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == _calls(whole)
    one = client.chat.completions.create(parallel_tool_calls=False, **kw).choices[0].message
    assert len(one.tool_calls) == 1
