"""The assistant message of a chat reply, whole or as stream deltas: reasoning split off into
`reasoning_content` when the template thinks (server/reasoning.py), then tool calls parsed
from the content when the request has tools (server/tools.py)."""

from __future__ import annotations

from typing import Any

from edge_infer.server import harmony
from edge_infer.server.reasoning import ReasoningStream, split_reasoning
from edge_infer.server.tools import ToolPlan, parse_tool_calls, stream_safe_prefix


class ReplyShaper:
    """plan: the request's tools (None: no tools); thinking: the template reasons in <think>;
    opened: the prompt ends inside <think>; harmony: the reply is gpt-oss's channels (harmony.py)."""

    def __init__(self, plan: ToolPlan | None, thinking: bool, opened: bool, harmony: bool = False) -> None:
        self.plan, self.thinking, self.opened, self.harmony = plan, thinking, opened, harmony
        self.tools_on = plan is not None and plan.choice != "none"

    def message(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """(message, finish_reason) of a whole reply."""
        if self.harmony:
            return self._harmony(text, finish)
        reasoning, content = split_reasoning(text, self.opened) if self.thinking else (None, text)
        msg, finish = self._with_tools(content, finish)
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return msg, finish

    def _harmony(self, text: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        reasoning, content, _ = harmony.parse(text)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        calls = self.calls(text) if self.tools_on else []
        if calls:
            msg["content"], msg["tool_calls"] = content or None, calls
            finish = "tool_calls" if finish == "stop" else finish
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        return msg, finish

    def calls(self, text: str) -> list[dict[str, Any]]:
        """A harmony reply's tool calls in OpenAI's shape (all, or the first when not parallel)."""
        assert self.plan is not None
        calls = parse_tool_calls(text, "harmony", self.plan.tools)[1]
        return calls if self.plan.parallel else calls[:1]

    def _with_tools(self, content: str, finish: str | None) -> tuple[dict[str, Any], str | None]:
        if not self.tools_on or self.plan is None:
            return {"role": "assistant", "content": content}, finish
        rest, calls = parse_tool_calls(content, self.plan.fmt, self.plan.tools)
        if not calls:
            return {"role": "assistant", "content": content}, finish
        return ({"role": "assistant", "content": rest, "tool_calls": calls if self.plan.parallel else calls[:1]},
                "tool_calls" if finish == "stop" else finish)

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """One choice's deltas as its text grows."""

    def __init__(self, shaper: ReplyShaper) -> None:
        self.s = shaper
        self.router = ReasoningStream(shaper.opened) if shaper.thinking else None
        self.channels = harmony.HarmonyStream() if shaper.harmony else None
        self.fed = 0  # text consumed (without reasoning)
        self.content = ""  # content so far
        self.sent = 0  # content characters sent

    def step(self, text: str, finished: bool, finish: str | None) -> tuple[dict[str, Any], str | None]:
        """(delta, finish_reason or None) for the text so far; an empty delta sends nothing new."""
        if self.channels is not None:
            return self._harmony_step(text, finished, finish)
        if self.router is not None:
            r_delta, c_delta = self.router.feed(text, finished)
        else:
            r_delta, c_delta = "", text[self.fed :]
            self.fed = len(text)
        self.content += c_delta
        delta: dict[str, Any] = {"reasoning_content": r_delta} if r_delta else {}
        if finished and self.s.tools_on:
            msg, finish = self.s._with_tools(self.content, finish)
            calls = msg.get("tool_calls") or []
            rest = (msg["content"] or "")[self.sent :] if calls else self.content[self.sent :]
            if rest:
                delta["content"] = rest
            if calls:
                delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(calls)]
            return delta, finish
        plan = self.s.plan
        safe = stream_safe_prefix(self.content, plan.fmt) if self.s.tools_on and plan is not None else len(self.content)
        if safe > self.sent:
            delta["content"] = self.content[self.sent : safe]
            self.sent = safe
        return delta, finish if finished else None

    def _harmony_step(self, text: str, finished: bool, finish: str | None) -> tuple[dict[str, Any], str | None]:
        assert self.channels is not None
        r_delta, c_delta = self.channels.feed(text, finished)
        delta: dict[str, Any] = {}
        if r_delta:
            delta["reasoning_content"] = r_delta
        if c_delta:
            delta["content"] = c_delta
        if not finished:
            return delta, None
        calls = self.s.calls(text) if self.s.tools_on else []
        if calls:
            delta["tool_calls"] = [{"index": j, **call} for j, call in enumerate(calls)]
            finish = "tool_calls" if finish == "stop" else finish
        return delta, finish
