"""Chat templates from GGUF metadata, rendered in a bounded Jinja2 sandbox.

`ChatTemplate.from_gguf(path)` reads `tokenizer.chat_template`; `render` gives the prompt
text exactly as llama-cpp-python's and Hugging Face's Jinja2 formatters do (same sandbox,
trim_blocks/lstrip_blocks, loopcontrols, `tojson`, `raise_exception`, `strftime_now`), within
the time, output and size bounds of limits.py (sandbox.py enforces them). A template is
rendered once on a sample conversation when it is made: one that goes past a bound there
refuses the model (UnsupportedModelError).

`encode` keeps special tokens to the template: every string of the request (message content,
roles, names, tool-call ids, function names and arguments, tools with their descriptions and
schemas) is swapped for a private marker (spans.py), the template is rendered, and the output
is tokenized piece by piece, template text with special-token parsing and request text
without it, however the template printed it (raw, trimmed, through `tojson`, ...). A user who
types "<|im_end|>" anywhere gets those characters, not the control token.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError

from edge_infer.chat.limits import MAX_SOURCE, ChatTemplateLimit
from edge_infer.chat.sandbox import BoundedSandbox, render
from edge_infer.chat.spans import Spans
from edge_infer.errors import ChatTemplateError, UnsupportedModelError

if TYPE_CHECKING:
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.tokenizer import Tokenizer

__all__ = ["BUILTIN_STOPS", "BUILTIN_TEMPLATES", "ChatTemplate", "ChatTemplateLimit", "chat_by_default"]

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}

# Text that ends a reply under a built-in template whose markers may not be special tokens of
# the model's vocabulary (then EOS detection alone would not stop the model).
BUILTIN_STOPS: dict[str, tuple[str, ...]] = {"chatml": ("<|im_end|>", "<|im_start|>")}

# "base" as a word of a model's name or fine-tune label: a base model ships a template at times
# (Qwen's do) but continues text rather than answering.
_BASE_WORD = re.compile(r"(?<![a-z0-9])base(?![a-z0-9])", re.IGNORECASE)


def chat_by_default(metadata: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a prompt to this model should go through its chat template unless asked
    otherwise (llama-cli's conversation auto-mode, Ollama's `run`), and why, in words: the file
    has a `tokenizer.chat_template` and its `general.name` / `general.finetune` do not call it a
    base model."""
    template = metadata.get("tokenizer.chat_template")
    if not (isinstance(template, str) and template.strip()):
        return False, "the model has no chat template"
    for key in ("general.finetune", "general.name"):
        value = metadata.get(key)
        if isinstance(value, str) and _BASE_WORD.search(value):
            return False, f"the model calls itself a base model ({key} {value!r})"
    return True, "the model has a chat template"


class ChatTemplate:
    """A Jinja2 chat template with the BOS/EOS texts it may print."""

    def __init__(
        self, template: str, *, bos_token: str = "", eos_token: str = "", name: str = "chat_template"
    ) -> None:
        if not isinstance(template, str) or not template.strip():
            raise ChatTemplateError(f"{name}: the chat template is empty")
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        if len(template) > MAX_SOURCE:
            raise UnsupportedModelError(f"{name}: the chat template is {len(template):,} characters, over the "
                                        f"limit of {MAX_SOURCE:,}")
        try:
            self._template = BoundedSandbox().from_string(template)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(f"{name}: syntax error at line {e.lineno}: {e.message}") from None
        except RecursionError:
            raise UnsupportedModelError(f"{name}: the chat template nests too deeply to compile") from None
        self._try_sample()

    def _try_sample(self) -> None:
        """Render a sample conversation once: a template that goes past its bounds on it (an
        endless loop, a huge power, ...) is refused now, naming it, rather than on every request.
        Other errors are left to requests (the sample may not suit the template's rules)."""
        try:
            self._render([dict(m) for m in _SAMPLE], True, {})
        except ChatTemplateLimit as e:
            raise UnsupportedModelError(f"{e} (rendering a sample conversation at load); the chat template "
                                        "is refused") from None
        except ChatTemplateError:
            pass

    @classmethod
    def from_gguf(
        cls, source: str | os.PathLike[str] | GGUFFile, *, fallback: str | None = None
    ) -> ChatTemplate:
        """The model's `tokenizer.chat_template`; `fallback` ("chatml") is used only if it has none."""
        from edge_infer.formats.gguf import GGUFFile

        if isinstance(source, GGUFFile):
            return cls._from_metadata(source.metadata, source.path, fallback)
        with GGUFFile(source) as f:
            return cls._from_metadata(f.metadata, f.path, fallback)

    @classmethod
    def _from_metadata(cls, meta: Mapping[str, Any], where: str, fallback: str | None) -> ChatTemplate:
        tokens = meta.get("tokenizer.ggml.tokens") or []

        def text(key: str) -> str:
            i = meta.get(key)
            return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else ""

        bos, eos = text("tokenizer.ggml.bos_token_id"), text("tokenizer.ggml.eos_token_id")
        template = meta.get("tokenizer.chat_template")
        if isinstance(template, str) and template.strip():
            return cls(template, bos_token=bos, eos_token=eos, name=f"{where}: tokenizer.chat_template")
        if fallback is None:
            raise ChatTemplateError(
                f"{where}: the model has no tokenizer.chat_template; pass a template or choose a "
                f"fallback explicitly, e.g. ChatTemplate.from_gguf(path, fallback='chatml')"
            )
        if fallback not in BUILTIN_TEMPLATES:
            raise ChatTemplateError(
                f"unknown fallback chat template {fallback!r} (known: {', '.join(BUILTIN_TEMPLATES)})"
            )
        return cls(
            BUILTIN_TEMPLATES[fallback], bos_token=bos, eos_token=eos, name=f"builtin {fallback} template"
        )

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text for `messages` (dicts with "role" and "content"), as a person reads it.

        Extra keyword arguments (tools, documents, ...) are passed to the template.
        """
        return self._render([dict(m) for m in _check(messages)], add_generation_prompt, kwargs)

    def encode(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokenizer: Tokenizer,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of the prompt; special tokens come only from the template's own text.

        BOS is put in front when the vocabulary adds one and the template did not print it.
        """
        ids = tokenizer.encode_segments(self._segments(messages, add_generation_prompt, kwargs), add_special=False)
        return _with_bos(ids, tokenizer)

    def encode_runs(self, messages: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, marker: str,
                    add_generation_prompt: bool = True, **kwargs: Any) -> list[list[int]]:
        """encode's ids cut where the message texts hold `marker` (an image's place): one run
        more than markers, each run tokenized on its own as libmtmd tokenizes the text between
        media markers; BOS (when added) opens the first run."""
        runs: list[list[tuple[str, bool]]] = [[]]
        for text, special in self._segments(messages, add_generation_prompt, kwargs):
            pieces = text.split(marker) if not special else [text]
            runs[-1].append((pieces[0], special))
            for piece in pieces[1:]:
                runs.append([(piece, special)])
        out = [tokenizer.encode_segments(r, add_special=False) for r in runs]
        out[0] = _with_bos(out[0], tokenizer)
        return out

    def message_starts(self, messages: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, ids: list[int],
                       **kwargs: Any) -> tuple[int, ...]:
        """Offsets in ids (encode's of the whole conversation) where messages[1:] begin, and
        where the reply begins after the last one: for each, the conversation up to there is
        rendered and tokenized, and the offset kept only where those ids are a prefix of `ids`
        (a template may render an earlier turn differently once later ones follow). For a context
        shift that keeps the first message and drops whole ones (engine/context_shift.py)."""
        starts: list[int] = []
        for i in range(1, len(messages) + 1):
            try:
                head = self.encode(messages[:i], tokenizer, add_generation_prompt=False, **kwargs)
            except ChatTemplateError:  # e.g. a template that wants the conversation to end with a user turn
                continue
            if 0 < len(head) < len(ids) and ids[: len(head)] == head and (not starts or len(head) > starts[-1]):
                starts.append(len(head))
        return tuple(starts)

    def _segments(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                  kwargs: dict[str, Any]) -> list[tuple[str, bool]]:
        """The rendered prompt as (text, parse_special) pieces (spans.py)."""
        spans = Spans()
        wrapped = [spans.wrap(m) for m in _check(messages)]
        try:
            rendered = self._render(wrapped, add_generation_prompt, {k: spans.wrap(v) for k, v in kwargs.items()})
        except ChatTemplateError as e:  # its message may quote request text: the real text, not markers
            raise type(e)(spans.restore(str(e))) from None
        return spans.segments(rendered)

    def _render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, kwargs: dict[str, Any]
    ) -> str:
        args: dict[str, Any] = {"functions": None, "function_call": None, "tools": None, "tool_choice": None}
        args.update(kwargs)
        args.update(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        try:
            return render(self._template, args)
        except ChatTemplateLimit as e:
            raise ChatTemplateLimit(f"{self.name}: {e}") from None
        except ChatTemplateError:
            raise
        except SecurityError as e:
            raise ChatTemplateError(
                f"{self.name}: blocked an attempt to leave the template sandbox ({e})"
            ) from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"{self.name}: rendering failed: {type(e).__name__}: {e}") from None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r}, {len(self.source)} chars)"


# Every template is rendered on this once, when it is made (ChatTemplate._try_sample).
_SAMPLE = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "What is 2+2?"},
)


def _with_bos(ids: list[int], tokenizer: Tokenizer) -> list[int]:
    bos = tokenizer.bos_id
    if tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
        ids.insert(0, bos)
    return ids


def _check(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be a dict with a string 'role'")
    return messages
