"""hub.pull of an http(s) URL against a loopback server: resume, Range ignored, 416, checksum, errors."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from edge_infer import hub
from edge_infer.errors import HubError
from edge_infer.hub import downloader


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache for this test; returns its models folder (not created yet)."""
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(downloader, "RETRY_DELAY", 0.0)
    return tmp_path / "cache" / "models"


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> bytes:
    """The bytes of a small but real GGUF file (a few tens of KB, so a cut lands mid-body)."""
    path = tmp_path / "src" / "tiny.gguf"
    path.parent.mkdir()
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_uint32("llama.block_count", 1)
    w.add_tensor("token_embd.weight", np.arange(64 * 128, dtype=np.float32).reshape(128, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


# -- a loopback HTTP server whose behaviour each test scripts ----------------------------
class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        srv = self.server
        srv.requests.append({k: v for k, v in self.headers.items()})
        mode = srv.modes.pop(0) if srv.modes else "normal"
        body = srv.body
        if self.path != "/tiny.gguf" or mode == "404":
            self.send_error(404)
            return
        start, rng = 0, self.headers.get("Range")
        if rng and mode != "ignore_range":
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.send_header("ETag", '"v1"')
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        data = body[start:]
        if mode == "cut":  # promise the whole body, send half, hang up
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    body: bytes
    modes: list[str]
    requests: list[dict[str, str]]

    def url(self, name: str = "tiny.gguf") -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{name}"


@pytest.fixture
def server(tiny_gguf: bytes) -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.body, srv.modes, srv.requests = tiny_gguf, [], []
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    t.join()


def test_url_pull_verifies_and_second_pull_is_instant(cache: Path, server: _Server) -> None:
    p = hub.pull(server.url(), sha256=sha(server.body).upper(), progress=False)
    assert p == cache / "tiny.gguf" and p.read_bytes() == server.body
    assert (cache / "tiny.gguf.sha256").read_text().split()[0] == sha(server.body)
    assert sorted(x.name for x in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.sha256"]
    assert hub.pull(server.url(), sha256=sha(server.body)) == p
    assert hub.pull(server.url()) == p
    assert len(server.requests) == 1


def test_url_pull_resumes_after_a_cut_connection(cache: Path, server: _Server) -> None:
    server.modes = ["cut"]
    p = hub.pull(server.url(), sha256=sha(server.body), progress=False)
    assert p.read_bytes() == server.body
    half = len(server.body) // 2
    assert "Range" not in server.requests[0]
    assert server.requests[1]["Range"] == f"bytes={half}-"
    assert server.requests[1]["If-Range"] == '"v1"'
    assert not (cache / "tiny.gguf.part").exists() and not (cache / "tiny.gguf.part.json").exists()


def test_url_pull_gives_up_keeps_part_and_resumes_next_time(cache: Path, server: _Server) -> None:
    server.modes = ["cut"] * downloader.ATTEMPTS
    with pytest.raises(HubError, match="interrupted") as e:
        hub.pull(server.url(), progress=False)
    part = cache / "tiny.gguf.part"
    assert str(part) in str(e.value) and "resume" in str(e.value)
    assert 0 < part.stat().st_size < len(server.body)
    assert not (cache / "tiny.gguf").exists()
    have = part.stat().st_size
    p = hub.pull(server.url(), sha256=sha(server.body), progress=False)
    assert p.read_bytes() == server.body
    assert server.requests[-1]["Range"] == f"bytes={have}-"


def test_url_pull_restarts_when_the_server_ignores_range(cache: Path, server: _Server) -> None:
    server.modes = ["cut", "ignore_range"]
    p = hub.pull(server.url(), sha256=sha(server.body), progress=False)
    assert "Range" in server.requests[1]
    assert p.read_bytes() == server.body  # not the first half followed by the whole file


def test_url_pull_of_a_whole_part_file_answered_416(cache: Path, server: _Server) -> None:
    cache.mkdir(parents=True)
    (cache / "tiny.gguf.part").write_bytes(server.body)
    (cache / "tiny.gguf.part.json").write_text(json.dumps({"url": server.url(), "validator": '"v1"'}))
    p = hub.pull(server.url(), sha256=sha(server.body), progress=False)
    assert p.read_bytes() == server.body and len(server.requests) == 1


def test_url_part_from_another_url_is_not_resumed(cache: Path, server: _Server) -> None:
    cache.mkdir(parents=True)
    (cache / "tiny.gguf.part").write_bytes(b"junk" * 100)
    (cache / "tiny.gguf.part.json").write_text(json.dumps({"url": "http://elsewhere/tiny.gguf"}))
    p = hub.pull(server.url(), sha256=sha(server.body), progress=False)
    assert p.read_bytes() == server.body and "Range" not in server.requests[0]


def test_url_checksum_mismatch_deletes_and_names_the_file(cache: Path, server: _Server) -> None:
    with pytest.raises(HubError) as e:
        hub.pull(server.url(), sha256="0" * 64, progress=False)
    msg = str(e.value)
    assert "tiny.gguf" in msg and "0" * 64 in msg and sha(server.body) in msg
    assert list(cache.iterdir()) == []


def test_url_404_is_a_clear_error(cache: Path, server: _Server) -> None:
    with pytest.raises(HubError, match="HTTP 404"):
        hub.pull(server.url("missing.gguf"), progress=False)
    assert not (cache / "missing.gguf").exists()


def test_url_refused_connection_says_no_network(cache: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HubError, match="cannot reach 127.0.0.1") as e:
        hub.pull(f"http://127.0.0.1:{port}/m.gguf", progress=False)
    assert "local .gguf" in str(e.value)


@pytest.mark.parametrize("url", ["http://example.com/model.bin", "https://example.com/", "http://x/.gguf"])
def test_url_must_name_a_gguf_file(cache: Path, url: str) -> None:
    with pytest.raises(HubError, match="must name a .gguf file"):
        hub.pull(url)


def test_bad_sha256_argument(cache: Path) -> None:
    with pytest.raises(HubError, match="64 hexadecimal digits"):
        hub.pull("http://example.com/m.gguf", sha256="abc")
