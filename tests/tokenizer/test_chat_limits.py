"""A GGUF's chat template renders within bounds: a huge power, nested loops, repeats, doubling
lists and strings, exploding macros, deep recursion and oversized output each end in a clear
ChatTemplateError (an InvalidRequest too: the server's 400) within seconds; a template that
does so on the sample conversation rendered at load refuses the model, naming its file."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from arch_models import write_arch_model

from edge_infer.chat import ChatTemplate
from edge_infer.errors import ChatTemplateError, InvalidRequest, UnsupportedModelError

TIME_LIMIT = 3.0  # edge_infer.chat.limits.MAX_SECONDS
HOSTILE = {  # template code -> words of its error
    "power": ("{{ (7 ** (messages|length * 5000000)) % 10 }}", "integer power"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     f"longer than its limit of {TIME_LIMIT:g} s"),
    "string repeat": ("{{ 'A' * 10**8 }}", "repeated string"),
    "doubling list": ("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}"
                      "{% endfor %}{{ ns.x|length }}", "size limit"),
    "doubling ~": ("{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}"
                   "{% endfor %}{{ ns.x|length }}", "joined with ~"),
    "exploding macro": ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
                        "longer than its limit"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
    "output": ("{% for i in range(100000) %}{% for j in range(100000) %}" + "x" * 64 + "{% endfor %}{% endfor %}",
               "rendered text is over its limit"),
    "width": ("{{ 'a'|center(10**9) }}{{ 'b'.ljust(10**9) }}", "over its limit of 100,000"),
    "replace": ("{{ ('a' * 1000).replace('', 'b' * 1000).replace('', 'c' * 1000) }}", "replace() result"),
    "join": ("{{ range(100000)|join('x' * 100000) }}", "joined string"),
    "range": ("{{ range(10**9)|list|length }}", "Range too big"),
}
MESSAGES = [{"role": "user", "content": "hi"}] * 5


def within(seconds: float, fn: Any) -> tuple[BaseException | None, float]:
    """(what fn() raised, seconds it took); fails if it is still running after `seconds`."""
    out: list[BaseException | None] = [None]

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            out[0] = e

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still rendering after {seconds} s"
    return out[0], time.monotonic() - t0


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_a_clear_bounded_error(name: str) -> None:
    code, words = HOSTILE[name]
    # hostile only past the sample conversation's 4 messages: it loads, then a request trips it
    tpl = ChatTemplate("{% if messages|length > 4 %}" + code + "{% endif %}ok")
    assert tpl.render(MESSAGES[:2]) == "ok"
    err, took = within(TIME_LIMIT + 20, lambda: tpl.render(MESSAGES))
    assert isinstance(err, ChatTemplateError) and isinstance(err, InvalidRequest), repr(err)
    assert words in str(err) and str(err).startswith("chat_template: ")
    assert took < TIME_LIMIT + 5


def test_template_hostile_at_load_refuses_the_model(tmp_path: Path) -> None:
    path = write_arch_model(tmp_path / "hostile.gguf", "llama", chat_template=HOSTILE["power"][0] + "ok")
    err, _ = within(30, lambda: ChatTemplate.from_gguf(path))
    assert isinstance(err, UnsupportedModelError), repr(err)
    assert str(path) in str(err) and "integer power" in str(err) and "refused" in str(err)
    err, took = within(TIME_LIMIT + 20, lambda: ChatTemplate(HOSTILE["nested loops"][0], name="m.gguf"))
    assert isinstance(err, UnsupportedModelError) and "m.gguf" in str(err) and "limit of 3 s" in str(err)
    assert took < TIME_LIMIT + 5


def test_ordinary_templates_are_untouched() -> None:
    # loops, literals, ~, + and filters well inside the bounds render as before
    tpl = ChatTemplate("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
                       "{{ [m.role, m.content]|join(':') ~ ';' }}{% endfor %}{{ ns.n }}{{ {'a': 2 ** 10}|tojson }}"
                       "{{ ('-' * 3)|center(7) }}{{ '%05d' % 42 }}{{ '{:>4}'.format(7) }}")
    assert tpl.render(MESSAGES[:2]) == 'user:hi;user:hi;4{"a": 1024}  ---  00042   7'
