"""A chat reply generated under a reasoning budget, for the dialects that have one (Anthropic's
`thinking.budget_tokens` / `output_config.effort`, the Responses API's `reasoning.effort`).

On a template that thinks (<think>), a reply still inside its thought after `budget` tokens gets
`</think>` appended to its tokens and generation continues from there, within max_tokens in all
(llama.cpp's --reasoning-budget does the same); a budget of 0 starts the reply after an empty,
closed thought (what Qwen3's template writes for enable_thinking=false). Templates that do not
think have no thought to budget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.types import Receive

from edge_infer.sampling_params import SamplingParams
from edge_infer.server.chat_run import ChatRun
from edge_infer.server.completions import cached_tokens
from edge_infer.server.engine_client import AsyncEngine, Stream, merge
from edge_infer.server.reasoning import CLOSE, OPEN
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.streaming import finished_or_gone

# reasoning effort -> budget in tokens (None: the model decides). Neither OpenAI nor Anthropic
# publishes numbers; these are ours (README)
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384,
                                         "xhigh": None, "max": None}


@dataclass(slots=True)
class Reply:
    """The reply so far: its text, tokens generated (with an inserted </think>), and once
    finished, why (the chat path's finish_reason) and the stop string or token that ended it."""

    text: str = ""
    tokens: int = 0
    prompt_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache served (known once finished)


def or_server_budget(budget: int | None, engine: AsyncEngine) -> int | None:
    """A request's reasoning budget, else the server's (--reasoning-budget)."""
    return engine.reasoning_budget if budget is None else budget


async def start_reply(engine: AsyncEngine, run: ChatRun, rid: str, budget: int | None
                      ) -> tuple[ChatRun, Replies]:
    """(the run as generated, its replies as they grow) under `budget` tokens of thought (None:
    no budget); the returned run's prompt and shaper account for a thought closed up front."""
    if not engine.thinks:
        budget = None
    if budget == 0:
        run, budget = await _without_thinking(engine, run), None
    params, limit = run.params, run.params.max_tokens
    first = params if budget is None or (limit is not None and budget >= limit) else dataclasses.replace(params, max_tokens=budget)
    # submitted now, so a refusal (context length, a full queue) is the response's status
    streams = await engine.submit([run.prompt], first, rid, run.lora, run.message_starts)
    return run, Replies(_generate(engine, run, rid, first, streams), streams)


class Replies:
    """A reply's snapshots as it grows (async iterable of Reply); aclose() aborts its engine
    request even before the first snapshot was read."""

    def __init__(self, gen: AsyncIterator[Reply], streams: list[Stream]) -> None:
        self.gen, self.streams = gen, streams

    def __aiter__(self) -> AsyncIterator[Reply]:
        return self.gen

    async def aclose(self) -> None:
        for s in self.streams:
            s.abort()
        await self.gen.aclose()  # type: ignore[attr-defined]


async def whole_reply(receive: Receive, replies: Replies, engine: AsyncEngine) -> Reply | None:
    """The finished reply; None when the client left first (the work is cancelled); a failure
    as the APIError to answer."""
    try:
        return await finished_or_gone(receive, _last(replies), lambda: engine.state == "draining")
    finally:
        await replies.aclose()


async def _last(replies: Replies) -> Reply:
    last = Reply()
    async for r in replies:
        last = r
    return last


async def _generate(engine: AsyncEngine, run: ChatRun, rid: str, first: SamplingParams,
                    streams: list[Stream]) -> AsyncIterator[Reply]:
    """The reply as it grows. Under a reasoning budget the first request (`first`, submitted as
    `streams`) stops after the budget's tokens; if the reply is then still thinking, </think> is
    appended to its tokens, and a second request continues from prompt + tokens for what
    max_tokens leaves."""
    params, prompt = run.params, run.prompt
    limit = params.max_tokens
    reply = Reply(prompt_tokens=len(prompt))
    ids: list[int] = []
    async for _, out in merge(streams):
        c = out.outputs[0]
        ids = c.token_ids
        reply = Reply(c.text, len(ids), len(prompt), out.finished, c.finish_reason, c.stop_reason, cached_tokens(out))
        if not (out.finished and first is not params and c.finish_reason == "length"):
            yield reply  # (a budget's first part that ran out goes on below)
    if first is params or reply.finish_reason != "length":
        return
    text, added = reply.text, list(ids)
    if _thinking(text, run.shaper.opened):  # spent: close the thought
        tok = engine.tokenizer
        assert tok is not None
        close = "\n" + CLOSE + "\n\n"
        close_ids = await engine.run(lambda: tok.encode(close, add_special=False, parse_special=True))
        text, added = text + close, added + close_ids
    left = None if limit is None else limit - len(added)
    if left is not None and left <= 0:
        yield dataclasses.replace(reply, text=text, tokens=len(added))
        return
    rest = dataclasses.replace(params, max_tokens=left)
    async for _, out in merge(await engine.submit([prompt + added], rest, rid + "-rest", run.lora, run.message_starts)):
        c = out.outputs[0]
        # the first part's prompt is this one's prefix: what the cache served of the original prompt
        yield Reply(text + c.text, len(added) + len(c.token_ids), len(prompt), out.finished, c.finish_reason,
                    c.stop_reason, min(reply.cached_tokens, len(prompt)))


def _thinking(text: str, opened: bool) -> bool:
    """Whether a reply's text ends inside its <think> block."""
    return (opened or text.lstrip().startswith(OPEN)) and CLOSE not in text


async def _without_thinking(engine: AsyncEngine, run: ChatRun) -> ChatRun:
    """The run with an empty, closed <think> block after its prompt (what Qwen3's template
    writes for enable_thinking=false; llama.cpp's --reasoning-budget 0)."""
    tok = engine.tokenizer
    assert tok is not None
    text = ("\n" if run.shaper.opened else OPEN + "\n\n") + CLOSE + "\n\n"
    ids = await engine.run(lambda: tok.encode(text, add_special=False, parse_special=True))
    s = run.shaper
    return dataclasses.replace(run, prompt=run.prompt + ids, shaper=ReplyShaper(s.plan, s.thinking, False))
