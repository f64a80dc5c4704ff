"""Anthropic Messages requests translated into the chat path's request (no server): a conversation
with tools, tool results and thinking keeps every turn in order; each refusal names its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edge_infer.server.anthropic_protocol import MessagesRequest, chat_request, reasoning_budget
from edge_infer.server.errors import APIError
from edge_infer.server.protocol import parse_body

WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _req(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_body(json.dumps(body).encode(), MessagesRequest)


def test_a_tool_conversation_keeps_every_turn_in_order() -> None:
    req = _req(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
               tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
               stop_sequences=["END"], temperature=0.5, top_k=4,
               messages=[{"role": "user", "content": "Weather in Paris and Rome?"},
                         {"role": "assistant", "content": [
                             {"type": "thinking", "thinking": "two cities", "signature": "s"},
                             {"type": "text", "text": "Checking."},
                             {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                             {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                             {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                              "content": [{"type": "text", "text": "no data"}]},
                             {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]}])
    chat = chat_request(req)
    msgs = chat.template_messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert msgs[0]["content"] == "Be brief.\nUse tools."
    assert msgs[2]["content"] == "Checking." and [json.loads(c["function"]["arguments"]) for c in msgs[2]["tool_calls"]] \
        == [{"city": "Paris"}, {"city": "Rome"}]
    assert (msgs[3]["tool_call_id"], msgs[3]["content"]) == ("toolu_1", "sunny")
    assert (msgs[4]["tool_call_id"], msgs[4]["content"]) == ("toolu_2", "Error: no data")
    assert msgs[5]["content"] == "And tomorrow?"
    assert chat.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"],
                                                            "description": "Weather in a city"}}]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.parallel_tool_calls is False
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_k) == (64, ["END"], 0.5, 4)


@pytest.mark.parametrize(("choice", "expect"), [({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
                                                ({"type": "none"}, "none")])
def test_tool_choice_kinds(choice: dict[str, Any], expect: str) -> None:
    assert chat_request(_req(tools=[WEATHER], tool_choice=choice)).tool_choice == expect


def test_output_format_and_reasoning_budget() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = chat_request(_req(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}))
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert reasoning_budget(_req(output_config={"effort": "low"})) == 1024
    assert reasoning_budget(_req(max_tokens=4000, thinking={"type": "enabled", "budget_tokens": 2000})) == 2000
    assert reasoning_budget(_req(thinking={"type": "disabled"})) == 0
    assert reasoning_budget(_req(thinking={"type": "adaptive"})) is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "input": {}}]}]}, "messages[0].content[0].input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]},
     "messages[0].content[0].input"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
    ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking.budget_tokens"),  # not below max_tokens 64
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
    ({"system": [{"type": "image", "source": {}}]}, "system[0]"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "context_management.edits[0]"),
    ({"context_management": {"clear": True}}, "context_management"),
])
def test_refusals_name_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        chat_request(_req(**fields))
    assert e.value.status == 400 and e.value.param == param, (e.value.param, e.value.message)


def test_unknown_top_level_fields_are_refused_and_bookkeeping_is_accepted() -> None:
    with pytest.raises(APIError) as e:
        parse_body(json.dumps({"model": "m", "max_tokens": 4, "messages": [], "container": "c"}).encode(), MessagesRequest)
    assert e.value.param == "container"
    chat_request(_req(metadata={"user_id": "u"}, service_tier="auto", speed="standard", inference_geo="eu",
                      cache_control={"type": "ephemeral"}))
