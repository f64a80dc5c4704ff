"""Loading (503 then 200), a model without a chat template, and graceful SIGTERM shutdown."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from edge_infer.config import EngineConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_server(start_server, gemma3_path: Path):  # type: ignore[no-untyped-def]
    return start_server(gemma3_path, "-t", "2", "--kv-cache-memory", "32MiB", "--max-model-len", "512",
                        "--shutdown-timeout", "1")


def test_health_503_while_loading(gemma_server) -> None:  # type: ignore[no-untyped-def]
    # uvicorn listens before the model is loaded: /health answered 503 until it was ready.
    assert gemma_server.health_seen[-1] == 200
    assert 503 in gemma_server.health_seen


def test_no_chat_template_is_400(gemma_server) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(gemma_server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]},
                   timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert "chat template" in err["message"] and "--chat-template chatml" in err["message"]
    assert err["code"] == "no_chat_template"
    r = httpx.post(
        gemma_server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=120
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_chatml_fallback_only_when_asked(gemma3_path: Path) -> None:
    from edge_infer.server.engine_client import AsyncEngine

    plain = AsyncEngine(EngineConfig(model=str(gemma3_path)))
    plain._setup_chat(gemma3_path)
    assert plain.chat_template is None and plain.chat_error
    chatml = AsyncEngine(EngineConfig(model=str(gemma3_path)), chat_fallback="chatml")
    chatml._setup_chat(gemma3_path)
    assert chatml.chat_template is not None and "<|im_end|>" in chatml.chat_stops


def test_sigterm_during_stream_exits_0(gemma_server) -> None:  # type: ignore[no-untyped-def]
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
    lines: list[str] = []
    with httpx.Client(timeout=120) as client, client.stream("POST", gemma_server.url + "/v1/completions",
                                                             json=body) as r:
        it = r.iter_lines()
        while sum(line.startswith("data: {") for line in lines) < 2:
            lines.append(next(it))
        t0 = time.monotonic()
        gemma_server.proc.send_signal(signal.SIGTERM)
        lines.extend(it)  # the stream ends (finished or aborted), properly framed
    assert [line for line in lines if line][-1] == "data: [DONE]"
    try:
        rc = gemma_server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"server still running 20 s after SIGTERM:\n{gemma_server.log()}")
    assert rc == 0, gemma_server.log()
    assert time.monotonic() - t0 < 20
    assert "Traceback" not in gemma_server.log()
