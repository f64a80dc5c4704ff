"""POST /v1/chat/completions: chat replies under the model's own template, whole or streamed.

Messages are rendered with ChatTemplate.encode, so message text is never parsed as special
tokens; request-supplied templates are refused in protocol.py. A model without a template is
a 400 unless the server was started with --chat-template.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response

from edge_infer.outputs import RequestOutput
from edge_infer.server.completions import final_outputs, usage
from edge_infer.server.engine_client import AsyncEngine, Stream, merge
from edge_infer.server.errors import APIError
from edge_infer.server.logprobs import chat_logprobs
from edge_infer.server.protocol import ChatCompletionRequest
from edge_infer.server.streaming import Receive, SSEResponse


async def create_chat_completion(req: ChatCompletionRequest, engine: AsyncEngine, model: str,
                                 receive: Receive) -> Response:  # fmt: skip
    messages = req.template_messages()
    n = req.n if req.n is not None else 1
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
    engine.check_ready()
    prompt = await engine.chat_prompt(messages)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    streams = await engine.submit([prompt], params, rid)
    base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = _chunks(streams, base, n, k, include_usage, engine)
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
        choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text}, "logprobs": lp,
                        "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})  # fmt: skip
    body = {**base, "object": "chat.completion", "choices": choices, "usage": usage(list(outs)),
            "system_fingerprint": engine.fingerprint}  # fmt: skip
    return JSONResponse(body)


async def _chunks(streams: list[Stream], base: dict[str, Any], n: int, k: int | None, include_usage: bool,
                  engine: AsyncEngine) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
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
    sent_text: dict[int, int] = {}
    sent_tok: dict[int, int] = {}
    done: set[int] = set()
    last: list[RequestOutput | None] = [None]
    async for _, out in merge(streams):
        last[0] = out
        for c in out.outputs:
            if c.index in done:
                continue
            delta = c.text[sent_text.get(c.index, 0) :]
            if not delta and not c.finished:
                continue
            lp = None
            if k is not None and c.logprobs is not None:
                t0 = sent_tok.get(c.index, 0)
                lp = chat_logprobs(tok, c.token_ids[t0:], c.logprobs[t0:], k)
                sent_tok[c.index] = len(c.token_ids)
            sent_text[c.index] = len(c.text)
            choice = {"index": c.index, "delta": {"content": delta} if delta else {}, "logprobs": lp,
                      "finish_reason": c.finish_reason}  # fmt: skip
            if c.finished:
                done.add(c.index)
                choice["stop_reason"] = c.stop_reason
            yield {**base, "choices": [choice]}
    if include_usage:
        yield {**base, "choices": [], "usage": usage(last)}
