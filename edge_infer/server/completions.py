"""POST /v1/completions: text completions for one or several prompts, whole or streamed.

Text prompts are tokenized with BOS as the model wants and never parsed for special tokens;
a prompt may also be token ids. Choice i*n + j is sample j of prompt i.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from edge_infer.outputs import RequestOutput
from edge_infer.server.engine_client import AsyncEngine, Stream, merge
from edge_infer.server.errors import APIError
from edge_infer.server.logprobs import completion_logprobs
from edge_infer.server.protocol import CompletionRequest
from edge_infer.server.streaming import Receive, SSEResponse, finished_or_gone

if TYPE_CHECKING:
    from edge_infer.engine.lora import AdapterRequest


def usage(outs: list[RequestOutput | None]) -> dict[str, Any]:
    """OpenAI's usage of finished outputs: token counts, and the prompt tokens the prefix cache
    served (prompt_tokens_details.cached_tokens)."""
    prompt = sum(len(o.prompt_token_ids) for o in outs if o is not None)
    completion = sum(len(c.token_ids) for o in outs if o is not None for c in o.outputs)
    return token_usage(prompt, completion, sum(cached_tokens(o) for o in outs if o is not None))


def token_usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def cached_tokens(out: RequestOutput) -> int:
    """Prompt tokens of out the prefix cache served (0 before the engine's last output)."""
    return out.metrics.num_cached_tokens if out.metrics is not None else 0


async def _finals(streams: list[Stream]) -> list[RequestOutput]:
    last: list[Any] = [None] * len(streams)
    async for i, out in merge(streams):
        last[i] = out
    return last


async def final_outputs(receive: Receive, streams: list[Stream], engine: AsyncEngine) -> list[RequestOutput] | None:
    """The finished output of every stream of a non-streaming request; None when the client
    went away first (its work is cancelled); engine failures become APIErrors."""
    return await finished_or_gone(receive, _finals(streams), lambda: engine.state == "draining")


async def create_completion(
    req: CompletionRequest, engine: AsyncEngine, model: str, receive: Receive, lora: AdapterRequest = ()
) -> Response:
    """The completions of a request's prompts (lora: the LoRA adapters they run with)."""
    prompts = req.prompts()
    n = req.n if req.n is not None else 1
    if req.suffix:
        raise APIError(400, "suffix is not supported", param="suffix", code="unsupported_parameter")
    if req.best_of is not None and req.best_of != n:
        raise APIError(400, f"best_of must equal n ({n}) when given, got {req.best_of}", param="best_of",
                       code="unsupported_parameter")
    if req.echo and req.logprobs is not None:
        raise APIError(400, "echo with logprobs is not supported (prompt logprobs are not computed)",
                       param="echo", code="unsupported_parameter")
    params = req.sampling_params(req.max_tokens, req.logprobs)
    tok = engine.tokenizer
    assert tok is not None
    echo = [p if isinstance(p, str) else tok.decode(p) for p in prompts] if req.echo else None
    rid = f"cmpl-{uuid.uuid4().hex}"
    # Tokenize here rather than on the engine thread, where it would delay everyone's next step.
    ids = await engine.run(
        lambda: [
            tok.encode(p, add_special=True, parse_special=False) if isinstance(p, str) else p for p in prompts
        ]
    )
    streams = await engine.submit(ids, params, rid, lora)
    base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        chunks = _chunks(streams, base, n, echo, req.logprobs, include_usage, engine)
        return SSEResponse(chunks, lambda: engine.state == "draining")
    outs = await final_outputs(receive, streams, engine)
    if outs is None:
        return Response(status_code=499)  # nobody is left to read it
    choices = []
    for i, out in enumerate(outs):
        prefix = echo[i] if echo else ""
        for c in out.outputs:
            lp = None
            if req.logprobs is not None and c.logprobs is not None:
                lp = completion_logprobs(tok, c.token_ids, c.logprobs, req.logprobs)
            choices.append({"index": i * n + c.index, "text": prefix + c.text, "logprobs": lp,
                            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
    body = {**base, "choices": choices, "usage": usage(list(outs)), "system_fingerprint": engine.fingerprint}
    return JSONResponse(body)


async def _chunks(streams: list[Stream], base: dict[str, Any], n: int, echo: list[str] | None,
                  k: int | None, include_usage: bool, engine: AsyncEngine) -> AsyncIterator[dict[str, Any]]:
    tok = engine.tokenizer
    assert tok is not None
    sent_text: dict[int, int] = {}
    sent_tok: dict[int, int] = {}
    offset: dict[int, int] = {}
    done: set[int] = set()
    last: list[RequestOutput | None] = [None] * len(streams)
    async for i, out in merge(streams):
        last[i] = out
        for c in out.outputs:
            idx = i * n + c.index
            if idx in done:
                continue
            prefix = echo[i] if echo and idx not in sent_text else ""
            delta = c.text[sent_text.get(idx, 0) :]
            if not (delta or prefix or c.finished):
                continue
            lp = None
            if k is not None and c.logprobs is not None:
                t0 = sent_tok.get(idx, 0)
                lp = completion_logprobs(
                    tok, c.token_ids[t0:], c.logprobs[t0:], k, offset.get(idx, 0) + len(prefix)
                )
                offset[idx] = offset.get(idx, 0) + len(prefix) + sum(len(t) for t in lp["tokens"])
                sent_tok[idx] = len(c.token_ids)
            sent_text[idx] = len(c.text)
            choice = {"index": idx, "text": prefix + delta, "logprobs": lp, "finish_reason": c.finish_reason}
            if c.finished:
                done.add(idx)
                choice["stop_reason"] = c.stop_reason
            yield {**base, "choices": [choice]}
    if include_usage:
        yield {**base, "choices": [], "usage": usage(last)}
