"""The bounded Jinja2 sandbox chat templates render in.

Jinja's immutable sandbox keeps a template away from Python's internals; this one also bounds
what a render may spend (the numbers are in limits.py):

- time: a monotonic deadline, checked at every loop step, call, filter, operator and output;
- output: all the text a render writes, inside macros and `{% set %}` blocks too;
- values: every list, dict, string a template makes (literals, `+ * % ~`, filter and method
  results) is measured, and the usual amplifiers (`**` and `*` on big operands, widths,
  `replace`, `join`, `indent`, `wordwrap`, `batch`, `lipsum`) are refused before they allocate;
- RecursionError, OverflowError and MemoryError become ChatTemplateLimit.

Each template's syntax tree is rewritten once, at compile time (`_Bounds`), so that loops,
`~`, literals and output go through these checks; the rest hooks the sandbox's own
`call`/`call_binop` and wraps every filter.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

from edge_infer.chat import checks
from edge_infer.chat.limits import MAX_OUTPUT, MAX_VALUE, ChatTemplateLimit
from edge_infer.chat.spans import Text, owner_of, plain, remark
from edge_infer.errors import ChatTemplateError


def render(template: jinja2.Template, args: dict[str, Any]) -> str:
    """template.render(**args) within the bounds (ChatTemplateLimit past one)."""
    outer = checks.start()
    try:
        return template.render(**args)
    except RecursionError:
        raise ChatTemplateLimit("rendering nests too deeply (recursion limit)") from None
    except OverflowError as e:
        raise ChatTemplateLimit(f"a value overflowed: {e}") from None
    except MemoryError:
        raise ChatTemplateLimit("rendering ran out of memory") from None
    finally:
        checks.finish(outer)


# Filters whose meaning depends on the characters (indent splits lines, int parses, ...): given
# a request Text they run on its real text and their result is marked again. Filters over the
# string as a sequence (list, first, join, map, ...) use Text's own methods instead.
_TEXT_FILTERS = frozenset({"capitalize", "center", "e", "escape", "float", "forceescape", "format", "indent", "int",
                           "lower", "replace", "string", "striptags", "title", "trim", "truncate", "upper", "urlencode",
                           "urlize", "wordcount", "wordwrap"})


def _bounded_filter(name: str, f: Any) -> Any:
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # the context/environment first

    @functools.wraps(f)  # keeps jinja_pass_arg
    def run(*args: Any, **kwargs: Any) -> Any:
        checks.tick()
        head, rest = args[:skip], checks.check_filter(name, args[skip:], kwargs)
        value = rest[0] if rest else None
        if isinstance(value, Text) and name in _TEXT_FILTERS:
            out = f(*head, *plain(rest), **plain(kwargs))
            return checks.fit(remark(value, out), f"the result of |{name}")
        return checks.fit(f(*head, *rest, **kwargs), f"the result of |{name}")

    return run


def tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """Transformers' chat-template tojson (no HTML escaping, non-ASCII kept); output that holds
    a request string is marked as request text whole."""
    width = len(indent) if isinstance(indent, str) else indent if checks.is_int(indent) else 0
    if width > 16:  # an indent repeats on every line at every depth
        raise checks.over("the indent given to |tojson", 16)
    owner = owner_of(x)
    text = json.dumps(plain(x), ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return owner.mark(text) if owner is not None else text


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template raised an error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # Jinja's names
    if not all(checks.is_int(v) for v in (n, min, max)) or n > 100 or max > 1000:
        raise checks.over("lipsum()'s paragraphs (100) or words", 1000)
    return str(generate_lorem_ipsum(n, html, min, max))


class _GenerationTag(jinja2.ext.Extension):
    """HF's `{% generation %}...{% endgeneration %}` (marks assistant text): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Bounds(NodeTransformer):
    """Routes loops, `~`, list/dict/tuple literals and every output through the sandbox's
    checks (calls of `environment.<hook>`)."""

    @staticmethod
    def _hook(name: str, args: list[Any], lineno: int) -> nodes.Call:
        return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [self._hook("emit", [c], c.lineno) for c in node.nodes]
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._hook("loop_over", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._hook("concat_checked", list(node.nodes), node.lineno)

    def _literal(self, node: nodes.Expr) -> nodes.Node:
        self.generic_visit(node)
        return self._hook("made", [node], node.lineno)

    visit_List = visit_Dict = _literal

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        return self._literal(node) if node.ctx == "load" else self.generic_visit(node)


class _Loop:
    """A loop's iterable, checking the deadline at every step (its len() if it has one)."""

    __slots__ = ("iterable",)

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator[Any]:
        for x in self.iterable:
            checks.tick()
            yield x


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """HF's and llama-cpp-python's chat-template environment (immutable sandbox, trim_blocks,
    lstrip_blocks, loopcontrols, `{% generation %}`, `tojson`, `raise_exception`,
    `strftime_now`) within the bounds of limits.py. Render with `render()`."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})

    def __init__(self) -> None:
        super().__init__(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                         extensions=[_GenerationTag, jinja2.ext.loopcontrols])
        self.filters["tojson"] = tojson
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, lipsum=_lipsum)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # fail at once (Jinja hands back an Undefined that prints as "" until something uses it)
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _Bounds().visit(super()._parse(source, name, filename))

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        if getattr(obj, "__self__", None) is self:  # a hook of _Bounds (kwargs: Jinja's _loop_vars)
            return obj(*args)
        checks.tick()
        target = getattr(obj, "__wrapped__", obj)  # Jinja's wrapper of str.format
        owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
        if isinstance(owner, str):
            args = checks.check_method(owner, name, args, kwargs)
        return checks.fit(super().call(context, obj, *args, **kwargs), f"the result of {name or 'a call'}()")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        checks.tick()
        if operator == "**":
            checks.check_pow(left, right)
        elif operator == "*":
            checks.check_mul(left, right)
        elif operator == "%" and isinstance(left, str):
            checks.check_percent(left, right)
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            if checks.size(left) + checks.size(right) > MAX_VALUE:
                raise checks.over("a sum of strings or lists' size", MAX_VALUE)
        return checks.fit(super().call_binop(context, operator, left, right), f"the result of {operator!r}")

    # -- the hooks _Bounds calls --------------------------------------------------------------
    def emit(self, value: Any) -> Any:
        """Output: counted against MAX_OUTPUT before it is turned into text."""
        checks.tick()
        n = checks.size(value)
        b = checks.current()
        if b is not None:
            b.written += n
            n = b.written
        if n > MAX_OUTPUT:
            raise ChatTemplateLimit(f"the rendered text is over its limit of {MAX_OUTPUT:,} characters")
        return value

    def loop_over(self, iterable: Any) -> _Loop:
        checks.tick()
        return _Loop(iterable)

    def concat_checked(self, *parts: Any) -> str:
        """`a ~ b`: Jinja's str_join, measured first."""
        checks.tick()
        if sum(checks.size(p) for p in parts) > MAX_VALUE:
            raise checks.over("a string joined with ~", MAX_VALUE)
        return "".join(map(str, parts))

    def made(self, value: Any) -> Any:
        """A list, dict or tuple literal, measured."""
        checks.tick()
        return checks.fit(value, "a list or dict literal")
