"""hf:user/repo[:QUANT] and `pull user/repo` through huggingface_hub, against a loopback server that
answers the hub's file-tree and resolve routes (HF_ENDPOINT): the quant picked from the file list
(vision projectors left out), a model split by gguf-py's writer joined back into one GGUF whose
tensors and metadata are the original's and whose greedy tokens are the same, a single-file repo
without a quant, a second pull served from the cache, a missing repo and a wrong sha256 named."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from edge_infer import hub
from edge_infer.errors import HubError
from edge_infer.hub import hf

pytest.importorskip("huggingface_hub")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _split(src: Path, out_dir: Path, stem: str, max_tensors: int) -> list[Path]:
    """`src` rewritten by gguf-py's own splitter (llama.cpp's gguf-split layout)."""
    r = GGUFReader(src)
    w = GGUFWriter(str(out_dir / f"{stem}.gguf"), r.fields["general.architecture"].contents(),
                   split_max_tensors=max_tensors)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = GGUFValueType(f.types[0])
        w.add_key_value(name, f.contents(), vtype, sub_type=GGUFValueType(f.types[-1]) if vtype == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(out_dir.glob(f"{stem}-*-of-*.gguf"))


class _Hub(ThreadingHTTPServer):
    repos: dict[str, dict[str, bytes]]
    sums: dict[str, str]  # path -> the sha256 the listing gives (the real one unless a test lies)
    requests: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Hub

    def _route(self) -> tuple[dict[str, bytes] | None, str]:
        self.server.requests.append(f"{self.command} {self.path}")
        path = self.path.split("?", 1)[0]
        for repo, files in self.server.repos.items():
            for prefix in (f"/api/models/{repo}/tree/main", f"/{repo}/resolve/main/"):
                if path.startswith(prefix):
                    return files, path[len(prefix):]
        return None, path

    def _missing(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_HEAD(self) -> None:
        self._file(body=False)

    def do_GET(self) -> None:
        files, rest = self._route()
        if files is not None and "/api/models/" in self.path:
            listing = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest(),
                        "lfs": {"oid": self.server.sums.get(p) or hashlib.sha256(b).hexdigest(), "size": len(b),
                                "pointerSize": 134}} for p, b in files.items()]
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._file(body=True)

    def _file(self, body: bool) -> None:
        files, name = self._route()
        if files is None or name not in files:
            self._missing()
            return
        data = files[name]
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path) -> Iterator[_Hub]:
    shards = _split(smollm2_path, tmp_path, "SmolLM2-Q4_1", max_tensors=120)
    assert len(shards) >= 2
    srv = _Hub(("127.0.0.1", 0), _Handler)
    srv.repos = {"test/smol-GGUF": {**{p.name: p.read_bytes() for p in shards}, "SmolLM2-F16.gguf": b"not fetched",
                                    "mmproj-SmolLM2-Q4_1.gguf": b"a vision projector", "README.md": b"# smol"},
                 "test/one-GGUF": {"model.gguf": smollm2_path.read_bytes()}}
    srv.sums, srv.requests = {}, []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{srv.server_address[1]}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path / "cache"))
    yield srv
    srv.shutdown()
    srv.server_close()


def test_shards_are_joined_into_the_original_model(hub_server: _Hub, smollm2_path: Path) -> None:
    path = hub.pull("test/smol-GGUF:Q4_1", progress=False)
    assert path == hf.local_path("hf:test/smol-GGUF:Q4_1") and not list(path.parent.glob("*.part*"))
    fetched = {r.split("/resolve/main/")[1] for r in hub_server.requests if r.startswith("GET") and "/resolve/" in r}
    assert fetched == {n for n in hub_server.repos["test/smol-GGUF"] if n.startswith("SmolLM2-Q4_1-")}
    joined, original = GGUFReader(path), GGUFReader(smollm2_path)
    assert [(t.name, t.tensor_type, t.data.tobytes()) for t in joined.tensors] == \
        [(t.name, t.tensor_type, t.data.tobytes()) for t in original.tensors]
    assert not any(k.startswith("split.") for k in joined.fields)
    assert {k: f.contents() for k, f in joined.fields.items() if not k.startswith("GGUF.")} == \
        {k: f.contents() for k, f in original.fields.items() if not k.startswith("GGUF.")}
    from edge_infer import LLM, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0)
    outs = []
    for model in ("hf:test/smol-GGUF:Q4_1", str(smollm2_path)):
        with LLM(model, kv_cache_memory="16MiB", max_model_len=256) as llm:
            outs.append(llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids)
    assert outs[0] == outs[1]
    before = len(hub_server.requests)
    assert hub.pull("hf:test/smol-GGUF:Q4_1") == path and len(hub_server.requests) == before  # cached


def test_quant_choice(hub_server: _Hub) -> None:
    with pytest.raises(HubError, match=r"no Q4_K_M file; it has .*F16.*Q4_1"):
        hub.resolve_model("hf:test/smol-GGUF")
    assert hub.resolve_model("hf:test/one-GGUF").read_bytes() == hub_server.repos["test/one-GGUF"]["model.gguf"]
    assert hf.choose(["a/m-Q4_K_M.gguf", "a/m-Q4_K_S.gguf", "mmproj-m-Q4_K_M.gguf"], None, "x/y") == ["a/m-Q4_K_M.gguf"]
    with pytest.raises(HubError, match="one of 3 shards"):
        hf.choose(["m-Q8_0-00001-of-00003.gguf", "m-Q8_0-00002-of-00003.gguf"], "q8_0", "x/y")


def test_errors_are_named(hub_server: _Hub) -> None:
    with pytest.raises(HubError, match="no such repository"):
        hub.pull("hf:test/missing-GGUF")
    with pytest.raises(HubError, match="hf:USER/REPO"):
        hub.resolve_model("hf:not-a-repo")
    hub_server.sums["model.gguf"] = "0" * 64
    with pytest.raises(HubError, match="does not match the hub's"):
        hub.pull("hf:test/one-GGUF")
    assert not hf.local_path("hf:test/one-GGUF").exists()
