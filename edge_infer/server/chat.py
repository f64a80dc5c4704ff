"""POST /v1/chat/completions: chat replies under the model's own template, whole or streamed.

Messages are rendered with ChatTemplate.encode, so no request text (content, names, tool calls,
tools) is ever parsed as special tokens, within the template's time and size bounds (a render
past one is a 400); request-supplied templates are refused in protocol.py. A model without a
template is a 400 unless the server was started with --chat-template.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response

from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams, StructuredOutputsParams
from edge_infer.server.completions import final_outputs, usage
from edge_infer.server.engine_client import AsyncEngine, Stream, merge
from edge_infer.server.errors import APIError
from edge_infer.server.logprobs import chat_logprobs
from edge_infer.server.protocol import ChatCompletionRequest
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.streaming import Receive, SSEResponse
from edge_infer.server.tools import plan_tools, template_history, tool_grammar


@dataclasses.dataclass(frozen=True, slots=True)
class ChatRun:
    """A chat request made ready for the engine: its prompt's token ids, sampling parameters,
    the shaper of its replies (reasoning and tool calls) and k, the top logprobs (None: off).
    The dialects (OpenAI's here, Anthropic's in messages.py) share it."""

    prompt: list[int]
    params: SamplingParams
    shaper: ReplyShaper
    k: int | None


async def prepare_chat(req: ChatCompletionRequest, engine: AsyncEngine) -> ChatRun:
    """Check a chat request's fields (400s name them), render its prompt under the model's
    template, and build its sampling parameters (a tool grammar when tool_choice demands a call)."""
    plan = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, engine.tool_format)
    messages = template_history(req.template_messages())
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    k = (req.top_logprobs or 0) if req.logprobs else None
    try:
        params = req.sampling_params(max_tokens, k, engine.chat_stops)
    except APIError as e:
        if e.param == "max_tokens" and req.max_completion_tokens is not None:
            e.param = "max_completion_tokens"
        elif e.param == "logprobs":
            e.param = "top_logprobs"
        raise
    grammar = tool_grammar(plan, engine.special_markers()) if plan else None
    if grammar is not None:
        if params.structured_outputs is not None:
            raise APIError(400, f"tool_choice {req.tool_choice!r} constrains the output to tool calls: it cannot be "
                           "combined with a structured output", param="tool_choice", code="invalid_value")
        params = dataclasses.replace(params, structured_outputs=StructuredOutputsParams(grammar=grammar))
    engine.check_ready()
    prompt = await engine.chat_prompt(messages, tools=plan.tools if plan else None)
    return ChatRun(prompt, params, ReplyShaper(plan, engine.thinks, engine.thinking_opened(prompt)), k)


async def create_chat_completion(req: ChatCompletionRequest, engine: AsyncEngine, model: str,
                                 receive: Receive) -> Response:
    run = await prepare_chat(req, engine)
    n, k, shaper = run.params.n, run.k, run.shaper
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    streams = await engine.submit([run.prompt], run.params, rid)
    base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = _chunks(streams, base, n, k, include_usage, engine, shaper)
        return SSEResponse(chunks, lambda: engine.state == "draining")
    outs = await final_outputs(receive, streams, engine)
    if outs is None:
        return Response(status_code=499)  # nobody is left to read it
    tok = engine.tokenizer
    assert tok is not None
    choices = []
    for c in outs[0].outputs:
        lp = (
            chat_logprobs(tok, c.token_ids, c.logprobs, k)
            if k is not None and c.logprobs is not None
            else None
        )
        message, finish = shaper.message(c.text, c.finish_reason)
        choices.append({"index": c.index, "message": message, "logprobs": lp,
                        "finish_reason": finish, "stop_reason": c.stop_reason})
    body = {**base, "object": "chat.completion", "choices": choices, "usage": usage(list(outs)),
            "system_fingerprint": engine.fingerprint}
    return JSONResponse(body)


async def _chunks(streams: list[Stream], base: dict[str, Any], n: int, k: int | None, include_usage: bool,
                  engine: AsyncEngine, shaper: ReplyShaper) -> AsyncIterator[dict[str, Any]]:
    tok = engine.tokenizer
    assert tok is not None
    for i in range(n):
        role = {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        yield {**base, "choices": [role]}
    states = {i: shaper.stream() for i in range(n)}
    sent_tok: dict[int, int] = {}
    done: set[int] = set()
    last: list[RequestOutput | None] = [None]
    async for _, out in merge(streams):
        last[0] = out
        for c in out.outputs:
            if c.index in done:
                continue
            delta, finish = states[c.index].step(c.text, c.finished, c.finish_reason)
            if not delta and not c.finished:
                continue
            lp = None
            if k is not None and c.logprobs is not None:
                t0 = sent_tok.get(c.index, 0)
                lp = chat_logprobs(tok, c.token_ids[t0:], c.logprobs[t0:], k)
                sent_tok[c.index] = len(c.token_ids)
            choice = {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            if c.finished:
                done.add(c.index)
                choice["stop_reason"] = c.stop_reason
            yield {**base, "choices": [choice]}
    if include_usage:
        yield {**base, "choices": [], "usage": usage(last)}
