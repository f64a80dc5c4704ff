"""Reasoning text: where the chat template makes the model think in `<think>...</think>`
(Qwen3, DeepSeek-R1 distills), the thinking goes to the message's `reasoning_content` and the
rest to `content`, whole or streamed, as llama.cpp and vLLM do. A template whose generation
prompt already opens `<think>` (R1 distills) makes the reply start inside the thinking.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """Whether a chat template teaches `<think>` reasoning."""
    return template is not None and OPEN in template and CLOSE in template


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply; opened: the prompt ended inside <think>.
    A reply cut off while thinking is all reasoning."""
    body = text.lstrip()
    if body.startswith(OPEN):
        body, opened = body[len(OPEN) :], True
    elif not opened:
        return None, text
    thought, sep, rest = body.partition(CLOSE)
    return thought.strip(), rest.lstrip() if sep else ""


class ReasoningStream:
    """Routes a streamed reply's growing text into reasoning and content deltas, holding back
    a partial tag at the end."""

    def __init__(self, opened: bool) -> None:
        self.state = "start" if not opened else "thinking"
        self.sent = 0  # characters of the text already routed

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning delta, content delta) for the text so far."""
        reasoning, content = "", ""
        while True:
            rest = text[self.sent :]
            if self.state == "start":
                stripped = rest.lstrip()
                if not stripped and not final:
                    return reasoning, content
                if stripped.startswith(OPEN):
                    self.sent += len(rest) - len(stripped) + len(OPEN)
                    self.state = "thinking"
                    continue
                if OPEN.startswith(stripped) and not final:
                    return reasoning, content  # maybe the tag, not yet whole
                self.state = "content"
                continue
            if self.state == "thinking":
                at = rest.find(CLOSE)
                if at >= 0:
                    reasoning += rest[:at]
                    self.sent += at + len(CLOSE)
                    self.state = "after"
                    continue
                keep = 0 if final else _partial_tail(rest, CLOSE)
                reasoning += rest[: len(rest) - keep]
                self.sent += len(rest) - keep
                return reasoning, content
            if self.state == "after":  # the blank line models put after </think>
                stripped = rest.lstrip()
                if not stripped and not final:
                    return reasoning, content
                self.sent += len(rest) - len(stripped)
                self.state = "content"
                continue
            content += rest
            self.sent = len(text)
            return reasoning, content


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0
