"""POST /v1/chat/completions: chat replies under the model's own template, whole or streamed.

Messages are rendered with ChatTemplate.encode, so no request text (content, names, tool calls,
tools) is ever parsed as special tokens, within the template's time and size bounds (a render
past one is a 400); request-supplied templates are refused in protocol.py. A model without a
template is a 400 unless the server was started with --chat-template. `reasoning_effort` on a
template that thinks sets a reasoning budget (budgeted.py: none 0, minimal 256, low 1,024,
medium 4,096, high 16,384 tokens, xhigh and max none; without it, the server's
--reasoning-budget where the request has one choice and no logprobs); on one that does not
there is no thought to budget.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from edge_infer.outputs import RequestOutput
from edge_infer.server.budgeted import EFFORT_BUDGETS, Replies, start_reply, whole_reply
from edge_infer.server.chat_run import ChatRun, prepare_chat
from edge_infer.server.completions import final_outputs, token_usage, usage
from edge_infer.server.engine_client import AsyncEngine, Stream, merge
from edge_infer.server.errors import APIError
from edge_infer.server.logprobs import chat_logprobs
from edge_infer.server.protocol import ChatCompletionRequest
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.streaming import Receive, SSEResponse

if TYPE_CHECKING:
    from edge_infer.engine.lora import AdapterRequest


async def create_chat_completion(req: ChatCompletionRequest, engine: AsyncEngine, model: str,
                                 receive: Receive, lora: AdapterRequest = ()) -> Response:
    """A chat reply, whole or streamed (lora: the LoRA adapters it runs with)."""
    if req.reasoning_effort is not None and req.reasoning_effort not in EFFORT_BUDGETS:
        raise APIError(400, f"reasoning_effort must be one of {', '.join(EFFORT_BUDGETS)}, got {req.reasoning_effort!r}",
                       param="reasoning_effort", code="invalid_value")
    run = await prepare_chat(req, engine, lora)
    n, k, shaper = run.params.n, run.k, run.shaper
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    budget = EFFORT_BUDGETS[req.reasoning_effort] if req.reasoning_effort is not None else engine.reasoning_budget
    # the server's --reasoning-budget applies where it can (one choice, no logprobs); a request's
    # reasoning_effort must
    fits = run.params.n == 1 and run.k is None
    if engine.thinks and (req.reasoning_effort is not None or (budget is not None and fits)):
        return await _with_budget(req, run, engine, base, receive, budget)
    streams = await engine.submit([run.prompt], run.params, rid, run.lora, run.message_starts)
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


async def _with_budget(req: ChatCompletionRequest, run: ChatRun, engine: AsyncEngine, base: dict[str, Any],
                       receive: Receive, budget: int | None) -> Response:
    """A chat reply under reasoning_effort's budget (budgeted.py): one choice, no logprobs."""
    for name, bad in (("n", run.params.n > 1), ("logprobs", run.k is not None)):
        if bad:
            raise APIError(400, f"{name}: reasoning_effort's budget runs one choice without logprobs; drop one of the "
                           "two", param=name, code="unsupported_parameter")
    run, replies = await start_reply(engine, run, base["id"], budget)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return SSEResponse(_budget_chunks(replies, base, include_usage, run.shaper), lambda: engine.state == "draining")
    last = await whole_reply(receive, replies, engine)
    if last is None:
        return Response(status_code=499)  # nobody is left to read it
    message, finish = run.shaper.message(last.text, last.finish_reason)
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": last.stop_reason}
    return JSONResponse({**base, "object": "chat.completion", "choices": [choice],
                         "usage": token_usage(last.prompt_tokens, last.tokens, last.cached_tokens),
                         "system_fingerprint": engine.fingerprint})


async def _budget_chunks(replies: Replies, base: dict[str, Any], include_usage: bool,
                         shaper: ReplyShaper) -> AsyncIterator[dict[str, Any]]:
    yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}]}
    state = shaper.stream()
    try:
        async for r in replies:
            delta, finish = state.step(r.text, r.finished, r.finish_reason)
            if delta or r.finished:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                if r.finished:
                    choice["stop_reason"] = r.stop_reason
                yield {**base, "choices": [choice]}
            if r.finished and include_usage:
                yield {**base, "choices": [], "usage": token_usage(r.prompt_tokens, r.tokens, r.cached_tokens)}
    finally:
        await replies.aclose()


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
