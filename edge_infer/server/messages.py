"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

The request is translated into a chat request (anthropic_protocol.py) and prepared by chat.py
(template, tools, grammar); the reply is shaped by the same ReplyShaper into Anthropic's content
blocks (`thinking`, `text`, `tool_use`), whole or as its stream events: message_start, ping,
content_block_start / _delta / _stop per block, message_delta (stop_reason end_turn,
max_tokens, stop_sequence or tool_use; output tokens), message_stop.

The reasoning budget (`thinking.budget_tokens`, else `output_config.effort`'s share; thinking
disabled is a budget of 0) is applied by budgeted.py. `thinking.display` "omitted" sends
thinking blocks without their text.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from edge_infer.server.anthropic_protocol import (
    CountTokensRequest,
    MessagesRequest,
    chat_request,
    reasoning_budget,
)
from edge_infer.server.budgeted import Replies, or_server_budget, start_reply, whole_reply
from edge_infer.server.chat_run import ChatRun, prepare_chat
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.streaming import SSEResponse

if TYPE_CHECKING:
    from edge_infer.engine.lora import AdapterRequest

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


async def count_tokens(req: CountTokensRequest, engine: AsyncEngine) -> dict[str, int]:
    """{"input_tokens": N}: the prompt's tokens under the model's template, tools included."""
    run = await prepare_chat(chat_request(req), engine)
    return {"input_tokens": len(run.prompt)}


async def create_message(req: MessagesRequest, engine: AsyncEngine, model: str, receive: Receive,
                         lora: AdapterRequest = ()) -> Response:
    """A Messages API reply, whole or as its events (lora: the LoRA adapters it runs with)."""
    omit = req.thinking is not None and req.thinking.display == "omitted"
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    run = _within_context(await prepare_chat(chat_request(req), engine, lora), engine)
    run, replies = await start_reply(engine, run, mid, or_server_budget(reasoning_budget(req), engine))
    stops = tuple(req.stop_sequences or ())
    if req.stream:
        return SSEResponse(_events(replies, run.shaper, mid, model, len(run.prompt), stops, omit),
                           lambda: engine.state == "draining", dialect="anthropic")
    last = await whole_reply(receive, replies, engine)
    if last is None:
        return Response(status_code=499)  # nobody is left to read it
    message, finish = run.shaper.message(last.text, last.finish_reason)
    body = _message_start(mid, model, last.prompt_tokens)
    body["content"] = _blocks(message, omit)
    body["stop_reason"], body["stop_sequence"] = _stop_reason(finish, last.stop_reason, stops)
    body["usage"] = {**_input_usage(last.prompt_tokens, last.cached_tokens), "output_tokens": last.tokens}
    return JSONResponse(body)


def _input_usage(prompt_tokens: int, cached: int) -> dict[str, int]:
    """Anthropic's split of the prompt: input_tokens the ones computed, cache_read_input_tokens
    those the prefix cache served (their sum is the prompt, as clients such as Claude Code add
    them up for the context used); nothing is written on a client's request, so no creation."""
    cached = min(cached, prompt_tokens)
    return {"input_tokens": prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}


def _within_context(run: ChatRun, engine: AsyncEngine) -> ChatRun:
    """max_tokens cut to the room the prompt leaves in the context (llama-server's way): Anthropic
    clients must send max_tokens and send their own large defaults. A prompt that fills the
    context keeps its max_tokens, and the engine's error names the lengths."""
    room = engine.max_model_len - len(run.prompt)
    limit = run.params.max_tokens
    if room >= 1 and limit is not None and limit > room:
        return dataclasses.replace(run, params=dataclasses.replace(run.params, max_tokens=room))
    return run


def _message_start(mid: str, model: str, prompt_tokens: int) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {**_input_usage(prompt_tokens, 0), "output_tokens": 0}}


def _stop_reason(finish: str | None, stop: str | int | None, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a stop string of the request's own is stop_sequence; the
    template's end-of-turn markers and EOS are end_turn."""
    if finish == "stop" and isinstance(stop, str) and stop in stops:
        return "stop_sequence", stop
    return _STOP.get(finish or "stop", "end_turn"), None


def _blocks(message: dict[str, Any], omit: bool) -> list[dict[str, Any]]:
    """Anthropic content blocks of a chat message (reasoning, content, tool calls); omit: the
    thinking block's text left out (thinking.display "omitted")."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": "" if omit else message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    blocks.extend(_tool_use(call) for call in message.get("tool_calls") or ())
    return blocks


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    try:
        args = json.loads(call["function"]["arguments"])
    except json.JSONDecodeError:
        args = {}
    tool_id = "toolu_" + call["id"].removeprefix("call_")
    return {"type": "tool_use", "id": tool_id, "name": call["function"]["name"], "input": args if isinstance(args, dict) else {}}


async def _events(replies: Replies, shaper: ReplyShaper, mid: str, model: str, prompt_tokens: int,
                  stops: tuple[str, ...], omit: bool) -> AsyncIterator[dict[str, Any]]:
    """Anthropic's stream events for a reply: each is {"type": <event name>, ...}."""
    yield {"type": "message_start", "message": _message_start(mid, model, prompt_tokens)}
    yield {"type": "ping"}
    state = shaper.stream()
    blocks = _BlockStream(omit)
    try:
        async for r in replies:
            delta, finish = state.step(r.text, r.finished, r.finish_reason)
            for event in blocks.feed(delta):
                yield event
            if r.finished:
                for event in blocks.close():
                    yield event
                reason, sequence = _stop_reason(finish, r.stop_reason, stops)
                # the final split of the prompt (the prefix cache's share is known now), as
                # Anthropic's own message_delta carries it
                yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                       "usage": {**_input_usage(prompt_tokens, r.cached_tokens), "output_tokens": r.tokens}}
                yield {"type": "message_stop"}
    finally:
        await replies.aclose()


class _BlockStream:
    """Chat deltas -> content block events: a block opens when its kind of text starts and
    closes when another kind begins; tool calls (whole, at the end) are one block each."""

    def __init__(self, omit: bool) -> None:
        self.index = -1
        self.kind: str | None = None
        self.omit = omit  # thinking blocks sent without their text

    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for key, kind, field, delta_type in (("reasoning_content", "thinking", "thinking", "thinking_delta"),
                                              ("content", "text", "text", "text_delta")):
            if delta.get(key):
                if self.kind != kind:
                    events += self.close()
                    events.append(self._open({"type": kind, field: "", **({"signature": ""} if kind == "thinking" else {})}))
                if not (self.omit and kind == "thinking"):
                    events.append({"type": "content_block_delta", "index": self.index,
                                   "delta": {"type": delta_type, field: delta[key]}})
        for call in delta.get("tool_calls") or ():
            events += self.close()
            block = _tool_use(call)
            events.append(self._open({**block, "input": {}}))
            events.append({"type": "content_block_delta", "index": self.index,
                           "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
            events += self.close()
        return events

    def _open(self, block: dict[str, Any]) -> dict[str, Any]:
        self.index += 1
        self.kind = block["type"]
        return {"type": "content_block_start", "index": self.index, "content_block": block}

    def close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        self.kind = None
        return [{"type": "content_block_stop", "index": self.index}]
