"""Bad input, API keys, the waiting-queue limit and client disconnects: each gets the
documented status and OpenAI's error shape, and the server keeps serving."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

KEY = "sk-test-errors-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "Hi"}]
C, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(start_server, smollm2_path: Path):  # type: ignore[no-untyped-def]
    # One running sequence and no waiting room: a second concurrent request gets 429.
    return start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "64MiB", "--max-model-len", "2048",
                        "--max-num-seqs", "1", "--max-queue", "0", "--api-key", KEY,
                        "--cors-origin", "http://ui.example", "--max-n", "4", "--max-messages", "8",
                        "--max-body", "65536")


def post(server: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"content-type": "application/json", **(AUTH if headers is None else headers)}
    return httpx.post(server.url + path, content=content, headers=h, timeout=120)


def check_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


BAD = [
    (C, b'{"prompt": "x", "max_tokens": ', 400, None),  # malformed JSON
    (C, b'{"prompt": "\xff\xfe"}', 400, None),  # invalid UTF-8
    (C, b"[1, 2]", 400, None),  # not an object
    (C, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    (C, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    (C, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    (C, {"prompt": {"text": "x"}}, 400, "prompt"),
    (C, {"prompt": []}, 400, "prompt"),
    (C, {"max_tokens": 3}, 400, "prompt"),
    (C, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    (C, {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    (C, {"prompt": "x", "n": 0}, 400, "n"),
    (C, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    (C, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    (C, {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (C, {"prompt": "x", "logit_bias": {"99999999": 1}}, 400, None),
    (C, {"prompt": [10**9]}, 400, None),  # token id outside the vocabulary
    (C, {"prompt": "word " * 2100, "max_tokens": 4}, 400, "prompt"),  # beyond --max-model-len 2048
    (C, {"prompt": "x", "model": "gpt-4o"}, 404, "model"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages[0].content"),
    (CHAT, {"messages": MSG, "chat_template": "{{ 'pwned' }}"}, 400, "chat_template"),
    (CHAT, {"messages": MSG, "chat_template_kwargs": {"x": 1}}, 400, "chat_template_kwargs"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    (CHAT, {"messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CHAT, {"messages": MSG, "model": "nope"}, 404, "model"),
    # the request limits (this server: --max-n 4 --max-messages 8 --max-body 65536)
    (C, {"prompt": "x", "n": 5}, 400, "n"),
    (C, {"prompt": "x", "stop": [f"s{i}" for i in range(17)]}, 400, "stop"),
    (C, {"prompt": "x", "stop": ["y" * 513]}, 400, "stop"),
    (C, {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}}, 400, "logit_bias"),
    (CHAT, {"messages": MSG * 9}, 400, "messages"),
    (C, {"prompt": "x" * 70000}, 413, None),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/v1/nope", {}, 404, None),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), BAD, ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)]
)
def test_bad_input(server, path: str, body: Any, status: int, param: str | None) -> None:  # type: ignore[no-untyped-def]
    check_error(post(server, path, body), status, param)


def test_api_keys(server) -> None:  # type: ignore[no-untyped-def]
    r = post(server, CHAT, {"messages": MSG, "max_tokens": 2}, headers={})
    assert check_error(r, 401)["code"] == "invalid_api_key"
    check_error(post(server, CHAT, {"messages": MSG}, headers={"Authorization": "Bearer wrong"}), 401)
    check_error(httpx.get(server.url + "/v1/models", timeout=30), 401)
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # open without a key
    assert httpx.get(server.url + "/metrics", timeout=30).status_code == 200


def test_cors_only_for_allowed_origin(server) -> None:  # type: ignore[no-untyped-def]
    pre = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = httpx.options(server.url + CHAT, headers={"Origin": "http://ui.example", **pre}, timeout=30)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://ui.example"
    bad = httpx.options(server.url + CHAT, headers={"Origin": "http://evil.example", **pre}, timeout=30)
    assert "access-control-allow-origin" not in bad.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://ui.example", **AUTH}, timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"


def test_unknown_field_is_400_naming_it_and_bookkeeping_fields_accepted(server) -> None:  # type: ignore[no-untyped-def]
    r = post(server, CHAT, {"messages": MSG, "max_tokens": 3, "temperature": 0, "frobnicate": {"x": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "frobnicate", r.text
    assert "frobnicate" in r.json()["error"]["message"]
    r = post(server, CHAT, {"messages": MSG, "max_tokens": 3, "temperature": 0, "user": "u1", "store": False,
                            "metadata": {"k": "v"}, "service_tier": "auto"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def _stream_lines(server: Any, client: httpx.Client, max_tokens: int):  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}
    return client.stream("POST", server.url + C, json=body, headers=AUTH, timeout=120)


def _wait_for(cond, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_queue_full_429(server, get_metrics) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client() as client, _stream_lines(server, client, 2000) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        busy = post(server, C, {"prompt": "x", "max_tokens": 2})
        err = check_error(busy, 429)
        assert busy.headers["retry-after"] == "1" and err["type"] == "rate_limit_error"
    # the stream's client has gone: its request ends (aborted) and the next is served. 60 s, as in
    # the disconnect test below: on a loaded CI machine the wait once ran out at 30 s (and took
    # 29.6 s in another run), with each /metrics answer waiting for an engine step
    seen: list[dict[str, float]] = []

    def idle() -> bool:
        seen.append(get_metrics(server.url))
        return seen[-1]["edge_infer_num_requests_in_flight"] == 0

    t0 = time.monotonic()
    assert _wait_for(idle, 60), (
        f"still in flight after {time.monotonic() - t0:.1f} s ({len(seen)} metrics reads); aborted "
        f"{seen[-1]['edge_infer_requests_aborted_total']}, tokens {seen[-1]['edge_infer_generation_tokens_total']}"
        f"\nserver log:\n{server.log()[-3000:]}"
    )
    assert post(server, C, {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_disconnect_aborts_and_frees_kv(server, get_metrics) -> None:  # type: ignore[no-untyped-def]
    before = get_metrics(server.url)
    aborted, generated = (
        before["edge_infer_requests_aborted_total"],
        before["edge_infer_generation_tokens_total"],
    )
    # a generation of 2,000 tokens (seconds even on an idle machine), so that a loaded one, where
    # the metrics query and the client's close take a while, cannot let it run to its end first
    # (240 tokens did, once, on CI: the request finished, so nothing was aborted)
    with httpx.Client() as client, _stream_lines(server, client, 2000) as r:
        lines = r.iter_lines()
        got = [line for _, line in zip(range(6), lines)]
        assert sum(line.startswith("data: {") for line in got) >= 3
        m = get_metrics(server.url)
        assert m["edge_infer_num_requests_running"] == 1 and m["edge_infer_kv_blocks_used"] > 0
    # the client has gone: within a step the request is aborted and its KV blocks freed. The wait
    # is long because on a loaded CI machine each /metrics answer waits for an engine step (10 s
    # ran out once); it cannot hide a missed abort: the request would then run to its end, which
    # the counts below catch.
    seen: list[dict[str, float]] = []

    def freed() -> bool:
        seen.append(get_metrics(server.url))
        return seen[-1]["edge_infer_num_requests_running"] == 0 and seen[-1]["edge_infer_kv_blocks_used"] == 0

    t0 = time.monotonic()
    keys = ("num_requests_running", "kv_blocks_used", "requests_aborted_total", "generation_tokens_total")
    assert _wait_for(freed, 60), (
        f"not freed after {time.monotonic() - t0:.1f} s ({len(seen)} metrics reads); last: "
        + ", ".join(f"{k}={seen[-1]['edge_infer_' + k]}" for k in keys)
        + f"; aborted before: {aborted}, tokens before: {generated}\nserver log:\n{server.log()[-3000:]}"
    )
    m = get_metrics(server.url)
    assert m["edge_infer_requests_aborted_total"] == aborted + 1
    assert m["edge_infer_generation_tokens_total"] - generated < 2000  # stopped early, not run to the end
    assert post(server, C, {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_limit_defaults_in_help_are_the_servers() -> None:
    import dataclasses

    from edge_infer.cli.serve import LIMIT_FLAGS
    from edge_infer.server.limits import RequestLimits

    defaults = {f.name: f.default for f in dataclasses.fields(RequestLimits)}
    assert {name: default for name, default, _ in LIMIT_FLAGS} == defaults
