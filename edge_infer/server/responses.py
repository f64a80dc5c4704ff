"""POST /v1/responses: OpenAI's Responses API over the chat path, stateless.

The request is translated into a chat request (responses_protocol.py) and prepared by chat.py;
the reply, shaped by the chat path's ReplyShaper, becomes output items: `reasoning` (its text as
reasoning_text), a `message` with one output_text part, and one `function_call` per tool call.
Streamed, in the API's events, each numbered by sequence_number: response.created,
response.in_progress, per item output_item.added / .done with its part and text events
(content_part.added / .done, output_text.delta / .done, reasoning_text.delta / .done,
function_call_arguments.delta / .done), then response.completed, or response.incomplete when
max_output_tokens ran out. The reasoning budget (`reasoning.effort`) is applied by budgeted.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from edge_infer.server.budgeted import Replies, Reply, or_server_budget, start_reply, whole_reply
from edge_infer.server.chat_run import prepare_chat
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.responses_protocol import ResponsesRequest, chat_request, reasoning_budget
from edge_infer.server.streaming import SSEResponse

if TYPE_CHECKING:
    from edge_infer.engine.lora import AdapterRequest


async def create_response(req: ResponsesRequest, engine: AsyncEngine, model: str, receive: Receive,
                          lora: AdapterRequest = ()) -> Response:
    """A Responses API reply, whole or as its events (lora: the LoRA adapters it runs with)."""
    rid = f"resp_{uuid.uuid4().hex}"
    run = await prepare_chat(chat_request(req), engine, lora)
    run, replies = await start_reply(engine, run, rid, or_server_budget(reasoning_budget(req), engine))
    base = _base(req, rid, model)
    if req.stream:
        return SSEResponse(_events(replies, run.shaper, base, len(run.prompt), engine), lambda: engine.state == "draining",
                           dialect="responses")
    last = await whole_reply(receive, replies, engine)
    if last is None:
        return Response(status_code=499)  # nobody is left to read it
    message, finish = run.shaper.message(last.text, last.finish_reason)
    items = [item for _, item in _items(message, rid)]
    return JSONResponse(await _finished(base, items, last, finish, engine))


def _base(req: ResponsesRequest, rid: str, model: str) -> dict[str, Any]:
    """The response object's fields that echo the request, status in_progress, no output yet."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else {"type": "text"}
    effort = req.reasoning.effort if req.reasoning is not None else None
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress", "error": None,
            "incomplete_details": None, "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": model, "output": [], "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None, "reasoning": {"effort": effort, "summary": None}, "store": False,
            "temperature": req.temperature, "text": {"format": fmt}, "tool_choice": req.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()], "top_p": req.top_p,
            "truncation": "disabled", "usage": None, "user": req.user, "metadata": req.metadata or {}}


async def _finished(base: dict[str, Any], items: list[dict[str, Any]], last: Reply, finish: str | None,
                    engine: AsyncEngine) -> dict[str, Any]:
    """The response object once the reply has finished: its output, status and usage."""
    reasoning = "".join(c["text"] for it in items if it["type"] == "reasoning" for c in it["content"])
    tok = engine.tokenizer
    assert tok is not None
    # the thought's tokens, counted again from its text (the reply's token ids are not split there)
    thought = len(await engine.run(lambda: tok.encode(reasoning, add_special=False, parse_special=False))) if reasoning else 0
    done = {**base, "status": "incomplete" if finish == "length" else "completed", "output": items,
            "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None}
    done["usage"] = {"input_tokens": last.prompt_tokens, "input_tokens_details": {"cached_tokens": last.cached_tokens},
                     "output_tokens": last.tokens, "output_tokens_details": {"reasoning_tokens": min(thought, last.tokens)},
                     "total_tokens": last.prompt_tokens + last.tokens}
    return done


def _items(message: dict[str, Any], rid: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, item) output items of a whole chat message: reasoning, message, function calls."""
    key = rid.removeprefix("resp_")[:24]
    out: list[tuple[str, dict[str, Any]]] = []
    if message.get("reasoning_content"):
        out.append(("reasoning", _reasoning_item(f"rs_{key}", message["reasoning_content"])))
    if message.get("content"):
        out.append(("message", _message_item(f"msg_{key}", message["content"])))
    out.extend(("function_call", _call_item(call)) for call in message.get("tool_calls") or ())
    return out


def _reasoning_item(iid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": iid, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": status}


def _message_item(iid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": iid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    key = call["id"].removeprefix("call_")
    return {"type": "function_call", "id": f"fc_{key}", "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


async def _events(replies: Replies, shaper: ReplyShaper, base: dict[str, Any], prompt_tokens: int,
                  engine: AsyncEngine) -> AsyncIterator[dict[str, Any]]:
    """The Responses API's stream events for a reply: each is {"type": <event name>, ...}."""
    seq = _Numbered()
    yield seq({"type": "response.created", "response": base})
    yield seq({"type": "response.in_progress", "response": base})
    state = shaper.stream()
    items = _ItemStream(base["id"])
    try:
        async for r in replies:
            delta, finish = state.step(r.text, r.finished, r.finish_reason)
            for event in items.feed(delta):
                yield seq(event)
            if r.finished:
                for event in items.close():
                    yield seq(event)
                done = await _finished(base, items.done, r, finish, engine)
                kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
                yield seq({"type": kind, "response": done})
    finally:
        await replies.aclose()


class _Numbered:
    """Numbers a stream's events in order (sequence_number)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        event["sequence_number"] = self.n
        self.n += 1
        return event


class _ItemStream:
    """Chat deltas -> output item events: an item opens when its kind of text starts and closes
    when another kind begins; tool calls (whole, at the end) are one item each."""

    def __init__(self, rid: str) -> None:
        self.key = rid.removeprefix("resp_")[:24]
        self.done: list[dict[str, Any]] = []  # finished items, in order
        self.kind: str | None = None
        self.text = ""

    @property
    def index(self) -> int:
        return len(self.done)

    def feed(self, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for key, kind in (("reasoning_content", "reasoning"), ("content", "message")):
            if delta.get(key):
                if self.kind != kind:
                    events += self.close()
                    events += self._open(kind)
                self.text += delta[key]
                name = "reasoning_text" if kind == "reasoning" else "output_text"
                event = {"type": f"response.{name}.delta", "item_id": self._id(kind), "output_index": self.index,
                         "content_index": 0, "delta": delta[key]}
                events.append(event if kind == "reasoning" else {**event, "logprobs": []})
        for call in delta.get("tool_calls") or ():
            events += self.close()
            item = _call_item(call)
            events.append({"type": "response.output_item.added", "output_index": self.index,
                           "item": {**item, "arguments": "", "status": "in_progress"}})
            common = {"item_id": item["id"], "output_index": self.index}
            events.append({"type": "response.function_call_arguments.delta", **common, "delta": item["arguments"]})
            events.append({"type": "response.function_call_arguments.done", **common, "arguments": item["arguments"],
                           "name": item["name"]})
            events.append({"type": "response.output_item.done", "output_index": self.index, "item": item})
            self.done.append(item)
        return events

    def _id(self, kind: str) -> str:
        return f"{'rs' if kind == 'reasoning' else 'msg'}_{self.key}"

    def _open(self, kind: str) -> list[dict[str, Any]]:
        self.kind, self.text = kind, ""
        iid = self._id(kind)
        empty = _reasoning_item(iid, "", "in_progress") if kind == "reasoning" else _message_item(iid, "", "in_progress")
        part = empty["content"][0]
        empty["content"] = []
        return [{"type": "response.output_item.added", "output_index": self.index, "item": empty},
                {"type": "response.content_part.added", "item_id": iid, "output_index": self.index, "content_index": 0,
                 "part": part}]

    def close(self) -> list[dict[str, Any]]:
        if self.kind is None:
            return []
        kind, iid = self.kind, self._id(self.kind)
        item = _reasoning_item(iid, self.text) if kind == "reasoning" else _message_item(iid, self.text)
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        common = {"item_id": iid, "output_index": self.index, "content_index": 0}
        text_done = {"type": f"response.{name}.done", **common, "text": self.text}
        events = [text_done if kind == "reasoning" else {**text_done, "logprobs": []},
                  {"type": "response.content_part.done", **common, "part": item["content"][0]},
                  {"type": "response.output_item.done", "output_index": self.index, "item": item}]
        self.done.append(item)
        self.kind = None
        return events
