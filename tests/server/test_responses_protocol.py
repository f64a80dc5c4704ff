"""Responses API requests translated into the chat path's request (no server): input items keep
their order (parallel function calls join one assistant turn); each refusal names its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edge_infer.server.errors import APIError
from edge_infer.server.protocol import parse_body
from edge_infer.server.responses_protocol import ResponsesRequest, chat_request, reasoning_budget

TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _req(**fields: Any) -> ResponsesRequest:
    return parse_body(json.dumps({"model": "m", "input": "hi", **fields}).encode(), ResponsesRequest)


def test_input_items_keep_their_order() -> None:
    chat = chat_request(_req(instructions="Be brief.", tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"},
                             parallel_tool_calls=False, max_output_tokens=50, temperature=0.2, top_p=0.9, input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris and Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city": "Rome"}',
         "id": "fc_2", "status": "completed"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]}]))
    msgs = chat.template_messages()
    assert [m["role"] for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert msgs[0]["content"] == "Be brief." and msgs[2]["content"] == "Paris and Rome?"
    assert msgs[3]["content"] == "Checking." and [c["id"] for c in msgs[3]["tool_calls"]] == ["c1", "c2"]
    assert [(m["tool_call_id"], m["content"]) for m in msgs[4:]] == [("c1", "sunny"), ("c2", "rain")]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert (chat.parallel_tool_calls, chat.max_tokens, chat.temperature, chat.top_p) == (False, 50, 0.2, 0.9)
    assert chat.tools is not None and chat.tools[0]["function"]["strict"] is True


def test_text_formats_and_efforts() -> None:
    schema = {"type": "object"}
    fmt = chat_request(_req(text={"format": {"type": "json_schema", "name": "x", "schema": schema}})).response_format
    assert fmt == {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert chat_request(_req(text={"format": {"type": "json_object"}})).response_format == {"type": "json_object"}
    assert [reasoning_budget(_req(reasoning={"effort": e})) for e in ("none", "low", "high", "max")] == [0, 1024, 16384, None]


@pytest.mark.parametrize(("fields", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "c"}, "conversation"),
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.input_image.image_url"]}, "include[0]"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format"),
    ({"tools": [{"type": "custom", "name": "x"}]}, "tools[0]"),
    ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "name": "f", "output": "x", "role": "user"}]},
     "input[0].role"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
])
def test_refusals_name_their_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        chat_request(_req(**fields))
    assert e.value.status == 400 and e.value.param == param, (e.value.param, e.value.message)
