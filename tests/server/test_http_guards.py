"""The request guards without a server (issue #33): Host header parsing and the default
--allowed-hosts per bound address, the text-size limit, and admission by sequences (prompts x n).
The live checks are in test_hostile_http.py."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")

from edge_infer.errors import InvalidRequest  # noqa: E402
from edge_infer.server.errors import APIError  # noqa: E402
from edge_infer.server.http_guards import default_allowed_hosts, host_allowed, host_name  # noqa: E402
from edge_infer.server.limits import RequestLimits  # noqa: E402
from edge_infer.server.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402


@pytest.mark.parametrize(("header", "name"), [
    ("Example.COM:8000", "example.com"), ("example.com.", "example.com"), ("[::1]:8000", "::1"),
    ("[0:0:0:0:0:0:0:1]", "::1"), ("127.0.0.1", "127.0.0.1"), ("localhost:", "localhost"),
    ("::1", None), ("a:b:c", None), ("host:port", None), ("[::1", None), ("", None), (":80", None),
])
def test_host_name(header: str, name: str | None) -> None:
    assert host_name(header) == name


def test_default_allowed_hosts_follow_the_bound_address() -> None:
    loop = default_allowed_hosts("127.0.0.1")
    assert set(loop) == {"127.0.0.1", "localhost", "::1"}
    assert all(host_allowed(h, loop) for h in ("127.0.0.1:8000", "LOCALHOST:8000", "[::1]:8000", "localhost"))
    assert not any(host_allowed(h, loop) for h in ("evil.example", "127.0.0.1.nip.io:8000", "[::2]", "", None))
    assert set(default_allowed_hosts("::1")) == set(loop)
    assert default_allowed_hosts("10.1.2.3") == ("10.1.2.3",)
    assert not host_allowed("localhost:8000", default_allowed_hosts("10.1.2.3"))
    for wildcard in ("0.0.0.0", "::", "[::]"):
        assert host_allowed("anything.example:1", default_allowed_hosts(wildcard))


def test_allowed_hosts_option() -> None:
    from edge_infer.cli.serve import _allowed_hosts

    hosts = _allowed_hosts(["api.example.com, *.internal", "::1"], "0.0.0.0")
    assert host_allowed("api.example.com:443", hosts) and host_allowed("a.b.internal", hosts)
    assert host_allowed("[::1]:8000", hosts) and not host_allowed("internal", hosts)
    assert not host_allowed("localhost", hosts)
    assert _allowed_hosts(None, "127.0.0.1") == default_allowed_hosts("127.0.0.1")
    with pytest.raises(InvalidRequest, match="--allowed-hosts"):
        _allowed_hosts(["a.com:x"], "127.0.0.1")


def test_serve_help_documents_allowed_hosts() -> None:
    from edge_infer.cli.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(), [])
    serve = parser.parse_args(["serve", "-m", "x", "--allowed-hosts", "a.com"])
    assert serve.allowed_hosts == ["a.com"]


def test_text_over_max_chars_is_400_naming_the_field() -> None:
    limits = RequestLimits(max_chars=100)
    ok = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x" * 96}]})  # + "user"
    limits.check(ok)
    big = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x" * 60}] * 2})
    with pytest.raises(APIError) as e:
        limits.check(big)
    assert e.value.status == 400 and e.value.param == "messages" and "128 characters" in e.value.message
    parts = {"role": "user", "content": [{"type": "text", "text": "y" * 70}]}
    tool = {"type": "function", "function": {"name": "f", "parameters": {"description": "z" * 90}}}
    with pytest.raises(APIError) as e:
        limits.check(ChatCompletionRequest.model_validate({"messages": [parts], "tools": [tool]}))
    assert e.value.param == "tools"
    with pytest.raises(APIError) as e:
        limits.check(CompletionRequest.model_validate({"prompt": ["a" * 60, "b" * 60]}))
    assert e.value.param == "prompt"
    limits.check(CompletionRequest.model_validate({"prompt": list(range(500))}))  # token ids are not text


def test_deeply_nested_tools_are_counted_without_recursion() -> None:
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    req = ChatCompletionRequest.model_construct(messages=[], tools=[deep])
    with pytest.raises(APIError):
        RequestLimits(max_chars=1000).check(req)


def _engine(max_num_seqs: int, max_queue: int):  # type: ignore[no-untyped-def]
    from edge_infer.server.engine_client import AsyncEngine

    return AsyncEngine(SimpleNamespace(max_num_seqs=max_num_seqs), max_queue=max_queue)  # type: ignore[arg-type]


def test_admission_counts_prompts_times_n() -> None:
    engine = _engine(2, 2)
    with pytest.raises(APIError) as e:
        engine.admit(3 * 2, 2)  # 3 prompts x n=2: can never fit in 4
    assert e.value.status == 400 and e.value.param == "n" and "6 sequences" in e.value.message
    with pytest.raises(APIError) as e:
        engine.admit(5, 1)
    assert e.value.status == 400 and e.value.param == "prompt"
    engine.in_flight["r"] = SimpleNamespace(seqs=3)  # type: ignore[assignment]
    with pytest.raises(APIError) as e:
        engine.admit(2, 2)
    assert e.value.status == 429 and "3 sequences in flight" in e.value.message
    engine.admit(1, 1)
