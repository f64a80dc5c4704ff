"""What a chat template's operations may cost: each render's budget (deadline, output, the
sizes it measured) and the checks that refuse an amplifier before it allocates (`**` and `*`
on big operands, widths, `replace`, `join`, `indent`, `wordwrap`, `batch`, `sum`). sandbox.py
calls them from its hooks; the numbers are in limits.py.
"""

from __future__ import annotations

import math
import re
import string
import threading
import time
from collections.abc import Mapping
from typing import Any

from jinja2.utils import Namespace

from edge_infer.chat.limits import MAX_INT_BITS, MAX_SECONDS, MAX_VALUE, MAX_WIDTH, ChatTemplateLimit
from edge_infer.chat.spans import plain

_local = threading.local()  # renders run on many threads at once; each has its own budget


class _Budget:
    """One render's deadline, output so far, and the sizes of the values it measured."""

    __slots__ = ("deadline", "written", "sizes")

    def __init__(self) -> None:
        self.deadline = time.monotonic() + MAX_SECONDS
        self.written = 0
        self.sizes: dict[int, tuple[Any, int]] = {}  # id -> (value, size); the value keeps the id alive


def current() -> _Budget | None:
    """The budget of the render running on this thread, if any."""
    return getattr(_local, "budget", None)


def start() -> _Budget | None:
    """Give this thread's render a fresh budget; returns the one it replaces (for finish)."""
    outer = current()
    _local.budget = _Budget()
    return outer


def finish(outer: _Budget | None) -> None:
    """End this thread's render: the budget before it (None outside renders) is current again."""
    _local.budget = outer


def tick() -> None:
    """Raise ChatTemplateLimit once this thread's render is past its deadline."""
    b = current()
    if b is not None and time.monotonic() > b.deadline:
        raise ChatTemplateLimit(f"rendering took longer than its limit of {MAX_SECONDS:g} s")


def size(x: Any) -> int:
    """Characters of text plus 8 per list or dict entry, deep, repeats counted every time: about
    what printing the value would cost (stops counting past MAX_VALUE)."""
    if isinstance(x, str):
        return len(x)
    if x is None or isinstance(x, (bool, int, float)):
        return 8
    b = current()
    memo = b.sizes if b is not None else {}
    hit = memo.get(id(x))
    if hit is not None and hit[0] is x:
        return hit[1]
    total = 8
    if isinstance(x, Namespace):  # mutable: measured afresh each time, never remembered
        for v in x._Namespace__attrs.values():
            total += 8 + size(v)
        return total
    if isinstance(x, Mapping):
        for k, v in x.items():
            total += 8 + size(k) + size(v)
            if total > MAX_VALUE:
                break
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            total += 8 + size(v)
            if total > MAX_VALUE:
                break
    memo[id(x)] = (x, total)
    return total


def fit(x: Any, what: str) -> Any:
    """x, when its size is within MAX_VALUE (else ChatTemplateLimit naming `what`)."""
    n = size(x)
    if n > MAX_VALUE:
        raise ChatTemplateLimit(f"{what} is over the size limit of one value ({MAX_VALUE:,} characters)")
    return x


def over(what: str, limit: int) -> ChatTemplateLimit:
    """The error for `what` going past `limit`."""
    return ChatTemplateLimit(f"{what} is over its limit of {limit:,}")


def is_int(x: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def check_pow(a: Any, b: Any) -> None:
    """`a ** b`: refused when the integer result would pass MAX_INT_BITS."""
    if is_int(a) and is_int(b) and b > 0 and abs(a) > 1 and b * math.log2(abs(a)) > MAX_INT_BITS:
        raise over("an integer power's size in bits", MAX_INT_BITS)


def check_mul(a: Any, b: Any) -> None:
    """`a * b`: refused for an integer past MAX_INT_BITS or a repeat past MAX_VALUE."""
    if is_int(a) and is_int(b):
        if a.bit_length() + b.bit_length() > MAX_INT_BITS + 1:
            raise over("an integer product's size in bits", MAX_INT_BITS)
        return
    seq, n = (a, b) if is_int(b) else (b, a)
    if is_int(n) and n > 0 and isinstance(seq, (str, list, tuple)) and size(seq) * n > MAX_VALUE:
        raise over("a repeated string or list's size", MAX_VALUE)


# the width and precision of a %-conversion, and the digits of a str.format spec
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _check_widths(widths: list[str], starred: bool, args: Any) -> None:
    total = 0
    for w in widths:
        if len(w) > 6 or int(w) > MAX_WIDTH:
            raise over("a format width", MAX_WIDTH)
        total += int(w)
    if total > MAX_VALUE:
        raise over("the widths of a format string", MAX_VALUE)
    values = args.values() if isinstance(args, Mapping) else args if isinstance(args, tuple) else (args,)
    if starred and any(is_int(v) and v > MAX_WIDTH for v in values):
        raise over("a format width", MAX_WIDTH)


def check_percent(fmt: str, args: Any) -> None:
    """`fmt % args` and |format: refused for widths or precisions past MAX_WIDTH."""
    found = _PERCENT.findall(plain(fmt))
    widths = [w for pair in found for w in pair if w and w != "*"]
    _check_widths(widths, any("*" in pair for pair in found), args)


def _check_str_format(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    specs = [spec for _, field, spec, _ in string.Formatter().parse(plain(fmt)) if field is not None and spec]
    widths = [w for spec in specs for w in _DIGITS.findall(spec)]
    _check_widths(widths, any("{" in spec for spec in specs), (*args, *kwargs.values()))


def _replaced_size(s: str, old: Any, new: Any, count: Any) -> int:
    s, old, new = plain(s), plain(old), plain(new)
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(s)
    hits = s.count(old) if old else len(s) + 1
    if is_int(count) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(0, len(new) - len(old))


def _joined(items: Any, sep: str) -> list[Any]:
    """`items` as a list, refused when joining them with `sep` would be too big."""
    items = list(items) if not isinstance(items, (list, tuple)) else items
    if size(items) + len(sep) * len(items) > MAX_VALUE:
        raise over("a joined string's size", MAX_VALUE)
    return list(items)


def check_method(owner: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Pre-checks of a str method call that could allocate too much; the (maybe listed) args."""
    if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
        if any(is_int(v) and v > MAX_WIDTH for v in (*args, *kwargs.values())):
            raise over(f"the width given to {name}()", MAX_WIDTH)
        if name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if is_int(tab) and owner.count("\t") * tab > MAX_VALUE:
                raise over("an expandtabs() result's size", MAX_VALUE)
    elif name == "replace" and len(args) >= 2:
        if _replaced_size(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)) > MAX_VALUE:
            raise over("a replace() result's size", MAX_VALUE)
    elif name == "join" and len(args) == 1:
        return (_joined(args[0], owner),)
    elif name == "format":
        _check_str_format(owner, args, kwargs)
    elif name == "format_map":
        _check_str_format(owner, (), dict(args[0]) if args and isinstance(args[0], Mapping) else {})
    return args


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def check_filter(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Pre-checks of a filter call (args from the value on); the (maybe listed) args."""
    value = args[0] if args else None
    if name in ("center", "batch", "slice", "truncate"):
        n = _arg(args, kwargs, 1, {"center": "width", "batch": "linecount", "slice": "slices"}.get(name, "length"), 0)
        if is_int(n) and n > MAX_WIDTH:
            raise over(f"the count given to |{name}", MAX_WIDTH)
    elif name == "indent" and isinstance(value, str):
        width = _arg(args, kwargs, 1, "width", 4)
        w = len(width) if isinstance(width, str) else width if is_int(width) else 0
        if w > MAX_WIDTH or len(value) + w * (value.count("\n") + 1) > MAX_VALUE:
            raise over("an |indent result's size", MAX_VALUE)
    elif name == "wordwrap" and isinstance(value, str):
        wrap = _arg(args, kwargs, 3, "wrapstring", None)
        if len(value) + (len(value) + 1) * (len(wrap) if isinstance(wrap, str) else 1) > MAX_VALUE:
            raise over("a |wordwrap result's size", MAX_VALUE)
    elif name == "replace" and isinstance(value, str) and len(args) >= 3:
        if _replaced_size(value, args[1], args[2], _arg(args, kwargs, 3, "count", None)) > MAX_VALUE:
            raise over("a |replace result's size", MAX_VALUE)
    elif name == "join" and value is not None:
        sep = _arg(args, kwargs, 1, "d", "")
        return (_joined(value, sep if isinstance(sep, str) else ""), *args[1:])
    elif name == "format" and isinstance(value, str):
        check_percent(value, kwargs or tuple(args[1:]))
    elif name == "list" and isinstance(value, str) and len(value) * 9 > MAX_VALUE:
        raise over("a |list of characters' size", MAX_VALUE)
    elif name == "sum" and value is not None:
        items = list(value)
        start = _arg(args, kwargs, 2, "start", 0)
        if not isinstance(start, (int, float)) and len(items) * size(items) > MAX_VALUE:
            raise over("the work of a |sum of sequences", MAX_VALUE)  # sum() of lists copies every step
        return (items, *args[1:])
    return args

