"""Chat templates from GGUF metadata, rendered in a Jinja2 sandbox.

`ChatTemplate.from_gguf(path)` reads `tokenizer.chat_template`; `render` gives the prompt
text exactly as llama-cpp-python's and Hugging Face's Jinja2 formatters do (same sandbox,
trim_blocks/lstrip_blocks, loopcontrols, `tojson`, `raise_exception`, `strftime_now`).

`encode` keeps special tokens to the template: message content is swapped for private
markers, the template is rendered, and the output is tokenized piece by piece, template
text with special-token parsing and content without it. A user who types "<|im_end|>"
gets those characters, not the control token. (Only message content is protected this
way; other fields a template prints, such as tool-call arguments, are template text.)
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edge_infer.errors import ChatTemplateError

if TYPE_CHECKING:
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.tokenizer import Tokenizer

__all__ = ["BUILTIN_STOPS", "BUILTIN_TEMPLATES", "ChatTemplate", "chat_by_default"]

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


class _GenerationTag(jinja2.ext.Extension):
    """HF's `{% generation %}...{% endgeneration %}` (marks assistant text): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The stock immutable sandbox, except that touching an unsafe attribute fails at once
    (Jinja would hand back an Undefined that prints as "" until something uses it)."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Transformers' chat-template tojson: no HTML escaping, non-ASCII kept.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template raised an error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


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
        env = _Sandbox(
            loader=jinja2.BaseLoader(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(template)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(f"{name}: syntax error at line {e.lineno}: {e.message}") from None

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
        contents = _Contents()
        wrapped = [contents.wrap_message(m) for m in _check(messages)]
        rendered = self._render(wrapped, add_generation_prompt, kwargs)
        segments: list[tuple[str, bool]] = []
        pos = 0
        for m in contents.pattern.finditer(rendered):
            segments.append((rendered[pos : m.start()], True))
            segments.append((contents.texts[int(m.group(1))], False))
            pos = m.end()
        segments.append((rendered[pos:], True))
        ids = tokenizer.encode_segments(segments, add_special=False)
        bos = tokenizer.bos_id
        if tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

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
            return self._template.render(**args)
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


def _check(messages: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be a dict with a string 'role'")
    return messages


class _Contents:
    """Message contents swapped for markers while the template renders (for encode)."""

    def __init__(self) -> None:
        nonce = secrets.randbelow(10**9)  # digits only: filters like |upper leave it alone
        self.prefix = f"\ue000{nonce}:"
        self.pattern = re.compile(re.escape(self.prefix) + "(\\d+)\ue001")
        self.texts: list[str] = []

    def marker(self, text: str) -> str:
        if not text:
            return text  # "" stays "": templates test content for emptiness
        self.texts.append(text)
        return _Marker(f"{self.prefix}{len(self.texts) - 1}\ue001", self, text)

    def wrap_message(self, m: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(m)
        content = out.get("content")
        if isinstance(content, str):
            out["content"] = self.marker(content)
        elif isinstance(content, list):
            out["content"] = [
                {**p, "text": self.marker(p["text"])}
                if isinstance(p, Mapping) and isinstance(p.get("text"), str)
                else p
                for p in content
            ]
        return out


class _Marker(str):
    """A content marker; strip()/trim on it strips the content it stands for."""

    def __new__(cls, marker: str, owner: _Contents, text: str) -> _Marker:
        obj = super().__new__(cls, marker)
        obj._owner = owner  # type: ignore[attr-defined]
        obj._text = text  # type: ignore[attr-defined]
        return obj

    def strip(self, chars: str | None = None) -> str:
        return self._owner.marker(self._text.strip(chars))  # type: ignore[attr-defined]

    def lstrip(self, chars: str | None = None) -> str:
        return self._owner.marker(self._text.lstrip(chars))  # type: ignore[attr-defined]

    def rstrip(self, chars: str | None = None) -> str:
        return self._owner.marker(self._text.rstrip(chars))  # type: ignore[attr-defined]
