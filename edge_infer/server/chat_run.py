"""A chat request made ready for the engine (`prepare_chat`), shared by the dialects: OpenAI's
chat completions (chat.py), Anthropic's Messages (messages.py) and the Responses API
(responses.py): its fields checked, its prompt rendered under the model's template, its sampling
parameters built (with a tool grammar when tool_choice demands a call)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from edge_infer.engine.image_prompt import MultimodalPrompt
from edge_infer.sampling_params import SamplingParams, StructuredOutputsParams
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError
from edge_infer.server.protocol import ChatCompletionRequest
from edge_infer.server.replies import ReplyShaper
from edge_infer.server.tools import plan_tools, template_history, tool_grammar

if TYPE_CHECKING:
    from edge_infer.engine.lora import AdapterRequest


@dataclasses.dataclass(frozen=True, slots=True)
class ChatRun:
    """A chat request made ready for the engine: its prompt's token ids, sampling parameters,
    the shaper of its replies (reasoning and tool calls) and k, the top logprobs (None: off).
    The dialects (OpenAI's here, Anthropic's in messages.py) share it."""

    prompt: list[int] | MultimodalPrompt  # images: a MultimodalPrompt (read like its ids)
    params: SamplingParams
    shaper: ReplyShaper
    k: int | None
    lora: AdapterRequest = ()  # the LoRA adapters it runs with (routes_lora.py)
    message_starts: tuple[int, ...] = ()  # where its messages begin (AsyncEngine.chat_starts)


async def prepare_chat(req: ChatCompletionRequest, engine: AsyncEngine, lora: AdapterRequest = ()) -> ChatRun:
    """Check a chat request's fields (400s name them), render its prompt under the model's
    template, and build its sampling parameters (a tool grammar when tool_choice demands a call);
    lora: the LoRA adapters the run uses."""
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
    if engine.harmony:  # the channels are read from the special tokens (harmony.py)
        params = dataclasses.replace(params, skip_special_tokens=False)
    engine.check_ready()
    prompt = await engine.chat_prompt(messages, tools=plan.tools if plan else None)
    starts = await engine.chat_starts(messages, prompt, tools=plan.tools if plan else None)
    return ChatRun(prompt, params, ReplyShaper(plan, engine.thinks, engine.thinking_opened(prompt), engine.harmony), k,
                   lora, starts)
