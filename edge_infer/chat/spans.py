"""Request strings kept apart from template text while a chat template renders (`encode`).

Every string a caller hands the template (message content, roles, names, tool-call ids,
function names and arguments, tool descriptions and schemas, dict keys included) is swapped
for a `Text`: a str whose characters are a private marker and which acts, to the template, as
the string it stands for. Length, comparison, hashing, `in`, slicing, iteration, every str
method, repr() and format() work on the real text, and what they return is marked again, so
`content.strip()`, `name|upper` or `args|tojson` stay request text. The rendered output is cut
at the markers, and each marked text is tokenized without special-token parsing wherever the
template printed it. `tojson` output that holds a request string is marked whole (its JSON
punctuation is plain text either way; escaping cannot smuggle a control token through).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import Any

from edge_infer.chat.limits import MAX_MARKED, ChatTemplateLimit

_MARKER_COST = 64  # a marker's own memory, counted against MAX_MARKED with its text


class Spans:
    """The marked texts of one render: marker index -> real text."""

    def __init__(self) -> None:
        nonce = secrets.randbelow(10**12)  # digits only: no filter or escaping changes them
        self.prefix = f"\ue000{nonce}:"
        self.pattern = re.compile(re.escape(self.prefix) + "(\\d+)\ue001")
        self.texts: list[str] = []
        self.size = 0

    def mark(self, text: str) -> str:
        """A Text standing for `text` ("" stays "": templates test strings for emptiness)."""
        if not text:
            return ""
        if isinstance(text, Text):
            return text
        text = str.__str__(text)  # a plain str, whatever subclass came in
        self.size += len(text) + _MARKER_COST
        if self.size > MAX_MARKED:
            raise ChatTemplateLimit(f"the request's text and what the template derives from it are over the "
                                    f"limit of {MAX_MARKED:,} characters")
        self.texts.append(text)
        return Text(f"{self.prefix}{len(self.texts) - 1}\ue001", self, text)

    def wrap(self, value: Any) -> Any:
        """`value` with every string in it (keys too, at any depth) marked."""
        if isinstance(value, Text):
            return value
        if isinstance(value, str):
            return self.mark(value)
        if isinstance(value, Mapping):
            return {self.wrap(k): self.wrap(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.wrap(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.wrap(v) for v in value)
        return value

    def restore(self, text: str) -> str:
        """`text` with the markers in it replaced by their real text (for error messages)."""
        return self.pattern.sub(lambda m: self.texts[int(m.group(1))], text)

    def segments(self, rendered: str) -> list[tuple[str, bool]]:
        """(text, parse_special) pieces of a rendered prompt: template text True, marked text False."""
        out: list[tuple[str, bool]] = []
        pos = 0
        for m in self.pattern.finditer(rendered):
            out.append((rendered[pos : m.start()], True))
            out.append((self.texts[int(m.group(1))], False))
            pos = m.end()
        out.append((rendered[pos:], True))
        return out


class Text(str):
    """A request string inside a render: marker characters, the real text's behaviour."""

    _owner: Spans
    _text: str

    def __new__(cls, marker: str = "", owner: Spans | None = None, text: str = "") -> Any:
        if owner is None:  # type(s)(...) from Jinja's sandboxed str.format: a plain string
            return str(marker)
        obj = super().__new__(cls, marker)
        obj._owner = owner
        obj._text = text
        return obj

    def __len__(self) -> int:
        return len(self._text)

    def __getitem__(self, key: Any) -> Any:
        return self._owner.mark(self._text[plain(key)])

    def __iter__(self) -> Any:
        mark = self._owner.mark
        return (mark(c) for c in self._text)

    def __contains__(self, sub: object) -> bool:
        return plain(sub) in self._text

    def __eq__(self, other: object) -> bool:
        return self._text == plain(other)

    def __ne__(self, other: object) -> bool:
        return self._text != plain(other)

    def __lt__(self, other: Any) -> bool:
        return self._text < plain(other)

    def __le__(self, other: Any) -> bool:
        return self._text <= plain(other)

    def __gt__(self, other: Any) -> bool:
        return self._text > plain(other)

    def __ge__(self, other: Any) -> bool:
        return self._text >= plain(other)

    def __hash__(self) -> int:
        return hash(self._text)

    def __str__(self) -> str:
        return self  # str() keeps the marker (Jinja's output and filters call it)

    def __repr__(self) -> str:
        return self._owner.mark(repr(self._text))

    def __format__(self, spec: str) -> str:
        return self._owner.mark(format(self._text, plain(spec)))

    def __mod__(self, args: Any) -> Any:
        return self._owner.mark(self._text % plain(args))

    def __mul__(self, n: Any) -> Any:
        return self._owner.mark(self._text * n)

    __rmul__ = __mul__


def _delegate(name: str) -> Any:
    def method(self: Text, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self._text, name)(*plain(args), **{k: plain(v) for k, v in kwargs.items()})
        return remark(self, result)

    method.__name__ = method.__qualname__ = name
    return method


# Every public str method acts on the real text, except: join (the separator is embedded as a
# marker by str.join itself), format/format_map (Jinja's sandbox wraps them), encode (bytes of
# the marker, harmless) and the static maketrans.
for _name in dir(str):
    if not _name.startswith("_") and _name not in ("join", "format", "format_map", "encode", "maketrans"):
        setattr(Text, _name, _delegate(_name))


def plain(value: Any) -> Any:
    """`value` with Texts swapped back for their real text (in tuples, lists and dicts too)."""
    if isinstance(value, Text):
        return value._text
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def remark(source: Text, value: Any) -> Any:
    """What a Text's method or filter returned, its strings marked as request text again."""
    if isinstance(value, str):
        return source._owner.mark(value)
    if isinstance(value, list):
        return [source._owner.mark(v) if isinstance(v, str) else v for v in value]
    if isinstance(value, tuple):
        return tuple(source._owner.mark(v) if isinstance(v, str) else v for v in value)
    return value


def owner_of(value: Any) -> Spans | None:
    """The Spans of the first Text inside `value` (dict keys, lists, tuples), if any."""
    if isinstance(value, Text):
        return value._owner
    if isinstance(value, str):
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = owner_of(k) or owner_of(v)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for v in value:
            found = owner_of(v)
            if found is not None:
                return found
    return None
