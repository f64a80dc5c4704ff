"""Several models behind one server (server/model_pool.py) on the real smollm2, qwen2.5-coder-0.5b and
gemma3-270m: /v1/models lists them; concurrent streams to different models each give the text that
model gives alone; an unknown name is a 404 naming the served ones; keep-alive unloads an idle
model and the next request loads it again (the reload time is printed); --max-loaded-models 1
swaps models under concurrent load without an error; --models-dir serves a folder."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
NAMES = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m")
COMMON = ("-t", "1", "--kv-cache-memory", "32MiB", "--max-model-len", "512")


def _complete(url: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                      **extra}, timeout=600)


async def _stream(client: httpx.AsyncClient, url: str, model: str) -> str:
    text = ""
    async with client.stream("POST", url + "/v1/completions", json={
            "model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                import json

                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text += chunk["choices"][0]["text"]
    return text


async def _concurrent(url: str, models: list[str]) -> list[str]:
    async with httpx.AsyncClient(timeout=600) as client:
        return list(await asyncio.gather(*(_stream(client, url, m) for m in models)))


def _status(url: str) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}


def test_three_models_concurrent_streams(start_server) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(NAMES[0], "-m", NAMES[1], "-m", NAMES[2], *COMMON, "--max-loaded-models", "3")
    assert _status(srv.url) == {NAMES[0]: "loaded", NAMES[1]: "unloaded", NAMES[2]: "unloaded"}
    alone = {m: _complete(srv.url, m).json()["choices"][0]["text"] for m in NAMES}
    assert len(set(alone.values())) == 3, alone  # three different models answered
    assert _status(srv.url) == dict.fromkeys(NAMES, "loaded")
    texts = asyncio.run(_concurrent(srv.url, [*NAMES, *NAMES]))
    assert texts == [alone[m] for m in (*NAMES, *NAMES)]
    r = _complete(srv.url, "llama-70b")
    assert r.status_code == 404 and all(n in r.json()["error"]["message"] for n in NAMES)
    assert httpx.get(srv.url + "/health", timeout=30).json()["loaded"] == list(NAMES)


def test_keep_alive_unloads_and_the_next_request_reloads(start_server) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(NAMES[0], "-m", NAMES[1], *COMMON, "--keep-alive", "1")
    first = _complete(srv.url, NAMES[1]).json()["choices"][0]["text"]
    deadline = time.monotonic() + 30
    while _status(srv.url)[NAMES[1]] == "loaded" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _status(srv.url) == {NAMES[0]: "unloaded", NAMES[1]: "unloaded"}  # both idle past 1 s
    t0 = time.perf_counter()
    again = _complete(srv.url, NAMES[1]).json()["choices"][0]["text"]
    print(f"reload of {NAMES[1]} after keep-alive: {time.perf_counter() - t0:.2f} s")
    assert again == first
    # a request's keep_alive holds the model past the server's second ...
    assert _complete(srv.url, NAMES[0], keep_alive="10m").status_code == 200
    time.sleep(2)
    assert _status(srv.url)[NAMES[0]] == "loaded"
    # ... and 0 unloads it once the request is done
    assert _complete(srv.url, NAMES[0], keep_alive=0).status_code == 200
    time.sleep(1)
    assert _status(srv.url)[NAMES[0]] == "unloaded"
    assert _complete(srv.url, NAMES[0], keep_alive="soon").status_code == 400


def test_one_loaded_model_swaps_under_load(start_server, tmp_path: Path, smollm2_path: Path,
                                           qwen2_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "models"
    folder.mkdir()
    for name, path in (("small", smollm2_path), ("coder", qwen2_path)):
        (folder / f"{name}.gguf").symlink_to(path)
    # -m names one of the folder's files too: it is served once, and loaded first
    srv = start_server(str(folder / "coder.gguf"), *COMMON, "--models-dir", str(folder), "--max-loaded-models", "1")
    assert set(_status(srv.url)) == {"coder", "small"}
    alone = {m: _complete(srv.url, m).json()["choices"][0]["text"] for m in ("small", "coder")}
    order = ["small", "coder"] * 3
    texts = asyncio.run(_concurrent(srv.url, order))
    assert texts == [alone[m] for m in order]
    assert sum(s == "loaded" for s in _status(srv.url).values()) == 1
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    shutil.rmtree(folder)


def test_a_one_model_server_reloads_what_keep_alive_unloaded(start_server, get_metrics) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(NAMES[0], *COMMON)
    first = _complete(srv.url, NAMES[0], keep_alive=0)
    assert first.status_code == 200, first.text
    deadline = time.monotonic() + 30
    while any(k.startswith("edge_infer_kv_blocks_total") for k in get_metrics(srv.url)) and time.monotonic() < deadline:
        time.sleep(0.2)  # unloaded: no engine reports its pool
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    again = _complete(srv.url, NAMES[0])
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert _complete(srv.url, NAMES[0], keep_alive="1e999").status_code == 400
