"""gpt-oss's "harmony" replies: messages on channels, each `<|channel|>NAME[ to=RECIPIENT]
[<|constrain|>TYPE]<|message|>BODY` ended by `<|end|>` (the next starts with `<|start|>assistant`),
`<|call|>` or `<|return|>` (those two end generation and are not in the text).

- the `analysis` channel is the reasoning (`reasoning_content`);
- the `final` channel, and `commentary` without a recipient (a preamble to the user), are the
  content;
- `commentary` to `functions.NAME` is a tool call with the body as its JSON arguments (the
  recipient may also come before the channel: `<|start|>assistant to=functions.NAME<|channel|>`).

The reply is generated with its special tokens kept in the text (skip_special_tokens off), which
is what makes the channels readable; a template that writes `<|channel|>` and `<|message|>`
is taken to be harmony's.
"""

from __future__ import annotations

import json
import re
from typing import Any

START, CHANNEL, MESSAGE, END, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"
MARKERS = (START, CHANNEL, MESSAGE, END, CONSTRAIN)
_ENDS = re.compile(r"<\|(?:end|call|return)\|>")  # a message's end (the last two only in rendered history)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_SPECIAL = re.compile(r"<\|[a-z_]+\|>")


def is_harmony(template: str | None) -> bool:
    """Whether a chat template is gpt-oss's harmony format."""
    return template is not None and CHANNEL in template and MESSAGE in template and "<|start|>assistant" in template


def messages(text: str) -> list[tuple[str, str | None, str, bool]]:
    """(channel, recipient, body, complete) of each message in a reply so far; complete: its
    end was seen (the last may still be growing). A reply with no header at all is final text
    (one that starts with "<" waits: it may be a header being written)."""
    out: list[tuple[str, str | None, str, bool]] = []
    for chunk in text.split(START):
        if not chunk:
            continue
        head, sep, body = chunk.partition(MESSAGE)
        if not sep:  # a header still being written, or plain text from a model that wrote no header
            if not out and not head.lstrip().startswith("<"):
                out.append(("final", None, head, False))
            continue
        words = head.split(CHANNEL, 1)[1].replace(CONSTRAIN, " ").split() if CHANNEL in head else []
        channel = words[0] if words else "final"
        m = _RECIPIENT.search(head)
        ended = _ENDS.search(body)
        out.append((channel, m.group(1) if m else None, body[: ended.start()] if ended else body, ended is not None))
    return out


def parse(text: str) -> tuple[str | None, str, list[tuple[str, Any]]]:
    """(reasoning or None, content, [(function name, arguments)]) of a whole reply."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[tuple[str, Any]] = []
    for channel, recipient, body, _ in messages(text):
        if recipient is not None and recipient.startswith("functions."):
            try:
                args = json.loads(body)
            except json.JSONDecodeError:
                content.append(body)  # not a call after all: keep what it said
                continue
            calls.append((recipient.removeprefix("functions."), args))
        elif channel == "analysis":
            reasoning.append(body)
        else:
            content.append(_SPECIAL.sub("", body))
    return ("\n".join(reasoning) if reasoning else None), "".join(content), calls


class HarmonyStream:
    """A streamed reply's reasoning and content deltas as its text grows (tool calls are parsed
    from the whole reply at the end): a message's body streams once its header is complete, to
    its own kind, holding back a partial `<|end|>` or `<|start|>` at the end."""

    def __init__(self) -> None:
        self.sent: list[int] = []  # characters of each message's body already sent

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = "", ""
        found = messages(text)
        for i, (channel, recipient, body, complete) in enumerate(found):
            if i == len(self.sent):
                self.sent.append(0)
            if recipient is not None:
                continue  # a tool call: parsed whole at the end
            safe = len(body) if complete or final else _held_back(body)
            piece = body[self.sent[i]:safe]
            self.sent[i] = max(self.sent[i], safe)
            if channel == "analysis":
                reasoning += piece
            else:
                content += _SPECIAL.sub("", piece)
        return reasoning, content


def _held_back(body: str) -> int:
    """How much of a growing body is surely not the start of a marker."""
    for k in range(min(len(START) - 1, len(body)), 0, -1):
        if any(m.startswith(body[-k:]) for m in MARKERS):
            return len(body) - k
    return len(body)


def grammar(tools: list[dict[str, Any]], lit: Any) -> str:
    """A Lark grammar (llguidance's dialect) admitting one call of one of `tools` on the
    commentary channel (gpt-oss calls one function per message; the call ends generation)."""
    rules = [f"call_{i}" for i in range(len(tools))]
    lines = [f"start: {lit(CHANNEL)} \"commentary to=functions.\" ({' | '.join(rules)})"]
    for rule, tool in zip(rules, tools):
        f = tool["function"]
        schema = {**(f.get("parameters") or {"type": "object"}),
                  "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
        lines.append(f"{rule}: {json.dumps(f['name'] + ' ')} {lit(CONSTRAIN)} \"json\" {lit(MESSAGE)} "
                     f"%json {json.dumps(schema)}")
    return "\n".join(lines) + "\n"
