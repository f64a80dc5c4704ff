"""The dialects beside chat completions, through their official clients against one server:
Anthropic's Messages API (`anthropic`) and OpenAI's Responses API (`openai`'s responses.*).

On the real qwen2.5-coder-0.5b: a greedy reply is the same whole, streamed, and through
/v1/chat/completions (the translation loses nothing); count_tokens equals the prompt the reply
used; stop sequences and max tokens give their stop reasons / incomplete status; a tool round
trip in each dialect; a json_schema output format; errors in each dialect's shape. On a tiny
model whose template opens <think>: the reasoning budget closes the thought after its tokens and
the reply goes on, in both dialects; thinking disabled (effort none) gives no thought."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from arch_models import write_arch_model

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

KEY = "sk-test-messages"
MODEL = "qwen2.5-coder-0.5b"
GREEDY = {"temperature": 0}  # the 2026 SDKs no longer take temperature as an argument
ASK = {"system": "Answer in one short sentence.", "messages": [{"role": "user", "content": "Name a primary colour."}]}
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PARIS = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def server(start_server, qwen2_path: Path):  # type: ignore[no-untyped-def]
    return start_server(qwen2_path, "-t", "2", "--kv-cache-memory", "128MiB", "--max-model-len", "2048",
                        "--api-key", KEY)


@pytest.fixture(scope="module")
def client(server):  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=600)


def test_whole_streamed_and_chat_agree(server, client) -> None:  # type: ignore[no-untyped-def]
    whole = client.messages.create(model=MODEL, max_tokens=32, extra_body=GREEDY, **ASK)
    assert [b.type for b in whole.content] == ["text"] and whole.stop_reason == "end_turn", whole
    with client.messages.stream(model=MODEL, max_tokens=32, extra_body=GREEDY, **ASK) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert streamed.content[0].text == whole.content[0].text
    # the same prompt again: the prefix cache served its full blocks, and usage says so
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == prompt
    assert streamed.usage.cache_read_input_tokens >= prompt - 16 > 0 and streamed.usage.cache_creation_input_tokens == 0
    assert streamed.usage.output_tokens == whole.usage.output_tokens
    chat = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=600,
                      json={"model": MODEL, "max_tokens": 32, "temperature": 0,
                            "messages": [{"role": "system", "content": ASK["system"]}, *ASK["messages"]]}).json()
    assert chat["choices"][0]["message"]["content"] == whole.content[0].text
    assert chat["usage"]["prompt_tokens"] == prompt
    assert chat["usage"]["completion_tokens"] == whole.usage.output_tokens
    assert client.messages.count_tokens(model=MODEL, **ASK).input_tokens == prompt


def test_stop_sequence_and_max_tokens(client) -> None:  # type: ignore[no-untyped-def]
    long = {"messages": [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]}
    full = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, **long).content[0].text
    assert ", 5," in full, full
    cut = client.messages.create(model=MODEL, max_tokens=64, stop_sequences=[", 5,"], extra_body=GREEDY, **long)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", ", 5,")
    assert cut.content[0].text == full[: full.index(", 5,")]
    short = client.messages.create(model=MODEL, max_tokens=3, extra_body=GREEDY, **long)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_tool_use_round_trip(client) -> None:  # type: ignore[no-untyped-def]
    first = client.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], messages=PARIS, extra_body=GREEDY,
                                   tool_choice={"type": "tool", "name": "get_weather"})
    assert first.stop_reason == "tool_use", first
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    with client.messages.stream(model=MODEL, max_tokens=64, tools=[WEATHER], messages=PARIS, extra_body=GREEDY,
                                tool_choice={"type": "any"}) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
    history = [*PARIS, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": json.dumps({"temperature_celsius": 31, "sky": "sunny"})}]}]
    final = client.messages.create(model=MODEL, max_tokens=64, tools=[WEATHER], messages=history, extra_body=GREEDY,
                                   tool_choice={"type": "none"})
    assert final.stop_reason == "end_turn" and "31" in final.content[0].text, final


def test_claude_code_defaults_are_served(client) -> None:  # type: ignore[no-untyped-def]
    """What Claude Code sends by default: max_tokens 32,000 (past this 2,048-token context: cut to
    the room left), temperature 1, and with thinking a clear_thinking context edit."""
    body = {"model": MODEL, "max_tokens": 32000, "messages": ASK["messages"],
            "extra_body": {"temperature": 1, "context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                                                "keep": "all"}]}}}
    r = client.messages.create(**body)
    assert r.stop_reason in ("end_turn", "max_tokens") and r.usage.output_tokens < 2048
    with pytest.raises(anthropic.BadRequestError, match="clear_tool_uses"):
        client.messages.create(**{**body, "extra_body": {"context_management": {"edits": [
            {"type": "clear_tool_uses_20250919"}]}}})


def test_output_format_json_schema(client) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    r = client.messages.create(model=MODEL, max_tokens=32, output_config={"format": {"type": "json_schema", "schema": schema}},
                               **ASK)
    assert json.loads(r.content[0].text)["colour"] in ("red", "blue")


def test_errors_in_anthropic_shape(server, client) -> None:  # type: ignore[no-untyped-def]
    url = server.url + "/v1/messages"
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error" and r.json()["type"] == "error"
    assert httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60).status_code == 200
    r = httpx.post(url, content=b"{", headers={"x-api-key": KEY, "content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    with pytest.raises(anthropic.BadRequestError, match="this model takes no images: start the server with --mmproj"):
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="document blocks are not supported"):
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="top_q"):
        client.messages.create(model=MODEL, max_tokens=4, messages=body["messages"], extra_body={"top_q": 1})
    with pytest.raises(anthropic.NotFoundError, match="claude-opus"):
        client.messages.create(model="claude-opus-9", max_tokens=4, messages=body["messages"])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.count_tokens(
            model=MODEL, messages=body["messages"])


# a template that opens <think> in its generation prompt (R1's shape): the reply starts thinking
OPENED = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}{# </think> #}")


@pytest.fixture(scope="module")
def thinker_server(start_server, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # seed 2: weights whose greedy reply to "hi" runs past 1,100 tokens without EOS (most seeds'
    # replies end sooner, which would leave no thought long enough to budget)
    path = write_arch_model(tmp_path_factory.mktemp("think") / "m.gguf", "llama", chat_template=OPENED,
                            context_length=2048, seed=2)
    return start_server(path, "-t", "1", "--kv-cache-memory", "16MiB", "--max-model-len", "2048")


@pytest.fixture(scope="module")
def thinker(thinker_server):  # type: ignore[no-untyped-def]
    return anthropic.Anthropic(base_url=thinker_server.url, api_key="none", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def thinker_openai(thinker_server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=thinker_server.url + "/v1", api_key="none", max_retries=0, timeout=600)


def test_reasoning_budget_closes_the_thought(thinker, thinker_openai) -> None:  # type: ignore[no-untyped-def]
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra_body": GREEDY}
    # the random model never writes </think>: unbudgeted, the whole reply is thought
    plain = thinker.messages.create(max_tokens=1024, **ask)
    assert [b.type for b in plain.content] == ["thinking"] and plain.stop_reason == "max_tokens"
    budgeted = thinker.messages.create(max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024}, **ask)
    thought, text = budgeted.content
    assert (thought.type, text.type) == ("thinking", "text") and thought.thinking == plain.content[0].thinking
    assert budgeted.usage.output_tokens == 1100 and budgeted.stop_reason == "max_tokens"
    with thinker.messages.stream(max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024}, **ask) as s:
        streamed = s.get_final_message()
    # (a whole reply's parts are stripped of the whitespace around the tags; a stream's deltas,
    # sent as they come, cannot be)
    assert [(b.type, (getattr(b, "thinking", None) or getattr(b, "text", None)).strip()) for b in streamed.content] == \
        [("thinking", thought.thinking), ("text", text.text.strip())]
    omitted = thinker.messages.create(max_tokens=1100, thinking={"type": "enabled", "budget_tokens": 1024,
                                                                 "display": "omitted"}, **ask)
    assert omitted.content[0].thinking == "" and omitted.content[1].text == text.text
    # the Responses API's reasoning.effort "low" is the same 1,024-token budget
    low = thinker_openai.responses.create(model="m", input="hi", max_output_tokens=1100, temperature=0,
                                          reasoning={"effort": "low"})
    assert [item.type for item in low.output] == ["reasoning", "message"]
    assert low.output[0].content[0].text == thought.thinking and low.output[1].content[0].text == text.text
    assert low.status == "incomplete" and low.usage.output_tokens == 1100
    # and chat completions' reasoning_effort, whole and streamed
    chat = thinker_openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1100,
                                                  temperature=0, reasoning_effort="low")
    msg = chat.choices[0].message
    assert (msg.reasoning_content, msg.content) == (thought.thinking, text.text) and chat.usage.completion_tokens == 1100
    parts = {"reasoning_content": "", "content": ""}
    for chunk in thinker_openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                        max_tokens=1100, temperature=0, reasoning_effort="low", stream=True):
        for key in parts:
            parts[key] += getattr(chunk.choices[0].delta, key, None) or "" if chunk.choices else ""
    assert (parts["reasoning_content"].strip(), parts["content"].strip()) == (thought.thinking, text.text.strip())
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        thinker_openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                               reasoning_effort="extreme")


def test_thinking_disabled_starts_after_an_empty_thought(thinker, thinker_openai) -> None:  # type: ignore[no-untyped-def]
    r = thinker.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
                                thinking={"type": "disabled"}, extra_body=GREEDY)
    assert [b.type for b in r.content] == ["text"] and r.usage.output_tokens == 16
    none = thinker_openai.responses.create(model="m", input=[{"role": "user", "content": "hi"}], max_output_tokens=16,
                                           temperature=0, reasoning={"effort": "none"})
    assert [item.type for item in none.output] == ["message"] and none.output_text == r.content[0].text


# -- the Responses API -------------------------------------------------------------------------

FUNCTION = {"type": "function", "name": "get_weather", "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"], "strict": True}


@pytest.fixture(scope="module")
def oai(server):  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600)


def _chat(server, messages: list, **fields) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=600,
                      json={"model": MODEL, "messages": messages, "temperature": 0, **fields}).json()


def test_responses_whole_streamed_and_chat_agree(server, oai) -> None:  # type: ignore[no-untyped-def]
    ask = {"model": MODEL, "instructions": ASK["system"], "input": ASK["messages"][0]["content"],
           "max_output_tokens": 32, "temperature": 0}
    whole = oai.responses.create(**ask)
    assert whole.status == "completed" and [item.type for item in whole.output] == ["message"]
    with oai.responses.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and streamed.output_text == whole.output_text
    chat = _chat(server, [{"role": "system", "content": ASK["system"]}, *ASK["messages"]], max_tokens=32)
    assert chat["choices"][0]["message"]["content"] == whole.output_text
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat["usage"]["prompt_tokens"],
                                                                    chat["usage"]["completion_tokens"])
    short = oai.responses.create(**{**ask, "input": "Count from 1 to 20.", "max_output_tokens": 3})
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"


def test_responses_function_call_round_trip(server, oai) -> None:  # type: ignore[no-untyped-def]
    first = oai.responses.create(model=MODEL, input=PARIS, tools=[FUNCTION], tool_choice="required", temperature=0)
    (call,) = first.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
    with oai.responses.stream(model=MODEL, input=PARIS, tools=[FUNCTION], temperature=0,
                              tool_choice={"type": "function", "name": "get_weather"}) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert [(o.name, json.loads(o.arguments)) for o in streamed.output] == [("get_weather", {"city": "Paris"})]
    result = json.dumps({"temperature_celsius": 31, "sky": "sunny"})
    final = oai.responses.create(model=MODEL, tools=[FUNCTION], tool_choice="none", temperature=0, max_output_tokens=64,
                                 input=[*PARIS, call.model_dump(exclude_none=True),
                                        {"type": "function_call_output", "call_id": call.call_id, "output": result}])
    # the same conversation as chat messages gives the same reply: nothing was lost in translation
    chat = _chat(server, [*PARIS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result}], max_tokens=64,
        tools=[{"type": "function", "function": {k: FUNCTION[k] for k in ("name", "description", "parameters")}}],
        tool_choice="none")
    assert final.output_text == chat["choices"][0]["message"]["content"] and "31" in final.output_text


def test_responses_json_schema_and_refusals(server, oai) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    r = oai.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=32,
                             text={"format": {"type": "json_schema", "name": "c", "schema": schema, "strict": True}})
    assert json.loads(r.output_text)["colour"] in ("red", "blue")
    for fields, param in ((dict(previous_response_id="resp_1"), "previous_response_id"),
                          (dict(tools=[{"type": "web_search"}]), "tools[0]"),
                          (dict(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
                           "input[0].content[0]")):
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(**{"model": MODEL, "input": "hi", **fields})
        assert e.value.body["param"] == param, e.value.body
    # Codex CLI's bookkeeping is accepted
    ok = oai.responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False, prompt_cache_key="k",
                              include=["reasoning.encrypted_content"], text={"verbosity": "low"},
                              reasoning={"summary": "auto"})
    assert ok.status == "incomplete"


def test_the_server_reasoning_budget(start_server, thinker_server, thinker_openai) -> None:  # type: ignore[no-untyped-def]
    """--reasoning-budget (llama.cpp's) applies when the request names none, and a request's own wins."""
    path = thinker_server.proc.args[thinker_server.proc.args.index("serve") + 2]  # serve -m PATH
    budgeted = start_server(path, "-t", "1", "--kv-cache-memory", "16MiB", "--max-model-len", "2048",
                            "--reasoning-budget", "1024")
    client = openai.OpenAI(base_url=budgeted.url + "/v1", api_key="none", max_retries=0, timeout=600)
    ask = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 1100}
    want = thinker_openai.chat.completions.create(**ask, reasoning_effort="low").choices[0].message
    got = client.chat.completions.create(**ask).choices[0].message
    assert (got.reasoning_content, got.content) == (want.reasoning_content, want.content) and got.content
    unlimited = client.chat.completions.create(**ask, reasoning_effort="max").choices[0].message
    assert not unlimited.content and unlimited.reasoning_content.startswith(want.reasoning_content)
