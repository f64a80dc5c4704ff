"""Hostile HTTP clients against a live server (issue #33, findings 4, 5 and 9): a body over
--max-body is refused as it arrives, never held in memory (a Content-Length over the limit
before any byte is read, a chunked body as soon as it passes the limit); JSON routes take only
application/json (a page cannot post to a keyless server without a CORS preflight); Host
headers outside --allowed-hosts are 400s (DNS rebinding); admission counts prompts x n; the
text of a request is bounded before it is templated."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

MAX_BODY = 4 * 2**20
MAX_CHARS = 65536


@pytest.fixture(scope="module")
def server(start_server: Any, smollm2_path: Path) -> Any:
    # 2 running + 2 waiting sequences in all
    return start_server(smollm2_path, "-t", "1", "--kv-cache-memory", "32MiB", "--max-model-len", "512",
                        "--max-body", str(MAX_BODY), "--max-chars", str(MAX_CHARS), "--max-num-seqs", "2",
                        "--max-queue", "2")


def _peak_reset(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the kernel's peak RSS (VmHWM) starts again from now


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _send_until_answered(url: str, head: bytes, chunks: Iterator[bytes]) -> tuple[str, int]:
    """Send `head`, then `chunks` until the server answers (or they run out); (its status line and
    body, bytes of body sent)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    sent = 0
    try:
        s.sendall(head)
        for chunk in chunks:
            if select.select([s], [], [], 0)[0]:
                break  # the server has answered: stop sending
            try:
                s.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            part = s.recv(65536)
            if not part:
                break
            reply += part
    finally:
        s.close()
    return reply.decode(errors="replace"), sent


def _head(url: str, extra: str) -> bytes:
    host = url.removeprefix("http://")
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}\r\n").encode()


def _body_chunks(total: int, size: int = 2**16, chunked: bool = False) -> Iterator[bytes]:
    """`total` bytes (a multiple of `size`) of a JSON body that never ends, in `size` pieces."""
    for i in range(total // size):
        data = b'{"prompt": "'.ljust(size, b"x") if i == 0 else b"x" * size
        yield (b"%x\r\n%s\r\n" % (size, data)) if chunked else data


def test_content_length_over_the_limit_is_413_before_the_body(server: Any) -> None:
    total = 256 * 2**20
    _peak_reset(server.proc.pid)
    before = _peak_mib(server.proc.pid)
    reply, sent = _send_until_answered(server.url, _head(server.url, f"Content-Length: {total}\r\n"),
                                       _body_chunks(total))
    grown = _peak_mib(server.proc.pid) - before
    assert grown < 64, f"server peak RSS grew {grown:.0f} MiB"
    assert sent < 64 * 2**20, sent  # answered long before the body was sent (at once, in fact)
    assert reply.startswith("HTTP/1.1 413"), reply[:300]
    assert json.loads(reply.split("\r\n\r\n", 1)[1])["error"]["code"] == "body_too_large"


def test_chunked_body_is_refused_when_it_passes_the_limit(server: Any) -> None:
    total = 256 * 2**20
    _peak_reset(server.proc.pid)
    before = _peak_mib(server.proc.pid)
    reply, sent = _send_until_answered(server.url, _head(server.url, "Transfer-Encoding: chunked\r\n"),
                                       _body_chunks(total, chunked=True))
    grown = _peak_mib(server.proc.pid) - before
    assert grown < 64, f"server peak RSS grew {grown:.0f} MiB"
    assert sent < 64 * 2**20, sent  # the limit (4 MiB) plus what the sockets buffer, not the 256 MiB
    assert reply.startswith("HTTP/1.1 413"), reply[:300]


def test_a_body_within_the_limit_is_read(server: Any) -> None:
    body = json.dumps({"prompt": "Hello", "max_tokens": 2}).encode()
    head = _head(server.url, "Transfer-Encoding: chunked\r\n")
    reply, _ = _send_until_answered(server.url, head, iter([b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)]))
    assert reply.startswith("HTTP/1.1 200"), reply[:300]


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize("ctype", ["text/plain", None, "application/x-www-form-urlencoded", "multipart/form-data"])
def test_json_routes_need_application_json(server: Any, ctype: str | None) -> None:
    body = b'{"prompt": "Hi", "max_tokens": 2}'
    headers = {"content-type": ctype} if ctype else {}
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/tokenize", "/detokenize"):
        err = _error(httpx.post(server.url + path, content=body, headers=headers, timeout=60), 415)
        assert err["code"] == "unsupported_media_type"
        assert (ctype or "none") in err["message"]


def test_json_with_a_charset_is_accepted(server: Any) -> None:
    r = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "Hi", "max_tokens": 2}',
                   headers={"content-type": "Application/JSON; charset=utf-8"}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/models"])
@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "[::2]:{port}"])
def test_other_hosts_are_400(server: Any, path: str, host: str) -> None:
    port = server.url.rsplit(":", 1)[1]
    err = _error(httpx.get(server.url + path, headers={"host": host.format(port=port)}, timeout=30), 400)
    assert err["code"] == "invalid_host"


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.0.0.1"])
def test_loopback_hosts_are_answered(server: Any, host: str) -> None:
    port = server.url.rsplit(":", 1)[1]
    r = httpx.get(server.url + "/health", headers={"host": host.format(port=port)}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                   headers={"host": host.format(port=port)}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_request_needing_more_sequences_than_the_server_holds_is_400(server: Any) -> None:
    # 3 prompts x n=2 = 6 sequences > 2 running + 2 waiting: it could never be admitted
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 2},
                   timeout=60)
    err = _error(r, 400)
    assert err["param"] == "n" and "6 sequences" in err["message"]
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ["a"] * 5, "max_tokens": 2}, timeout=60)
    assert _error(r, 400)["param"] == "prompt"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == 4, r.text


def test_admission_counts_the_sequences_in_flight(server: Any) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 100, "ignore_eos": True, "n": 3, "stream": True}
    with httpx.Client(timeout=120) as client, client.stream("POST", server.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()  # held: a dropped iterator closes the stream (and aborts the request)
        assert next(lines).startswith("data: ")  # 3 sequences in flight, room for 1 more
        busy = client.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 2})
        err = _error(busy, 429)
        assert err["code"] == "queue_full" and "3 sequences in flight" in err["message"]
        ok = client.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_oversized_text_is_refused_before_templating(server: Any, path: str) -> None:
    # Under the message count and the body limit, over the characters: refused by the limit
    # (param messages, limit_exceeded), not after templating and tokenizing (context_length_exceeded)
    messages = [{"role": "user", "content": "word " * 400}] * 40
    t = time.monotonic()
    err = _error(httpx.post(server.url + path, json={"messages": messages}, timeout=60), 400)
    assert err["param"] == "messages" and err["code"] == "limit_exceeded", err
    assert str(MAX_CHARS) in err["message"]
    assert time.monotonic() - t < 30  # no hang


def test_too_many_messages_is_400(server: Any) -> None:
    err = _error(httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}] * 2049},
                            timeout=60), 400)
    assert err["param"] == "messages" and "2048" in err["message"]


def test_json_nested_past_the_parser_stack_is_400(server: Any) -> None:
    body = '{"prompt": "x", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"Content-Type": "application/json"},
                   timeout=60)
    err = _error(r, 400)
    assert err["code"] == "invalid_json" and "nested too deeply" in err["message"], err
