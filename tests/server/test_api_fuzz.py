"""The server fuzzed from its own OpenAPI schema (schemathesis, every route, 8 positive and 8
negative cases each; the campaign of thousands is benchmarks/fuzz_server.py): no 5xx, no call
without an answer, and afterwards the server is healthy, serves a normal request, and holds no
KV block."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from api_fuzz import fuzz

pytest.importorskip("schemathesis")

pytestmark = pytest.mark.slow


def test_fuzz_every_route(start_server, get_metrics, smollm2_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "16MiB", "--max-model-len", "64", "--max-n", "2")
    report = fuzz(srv.url, cases_per_operation=8)
    assert report.calls >= 150, report  # 235 measured: 8 cases of ~15 operations in two modes
    assert not report.failures, report.failures[:5]
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = get_metrics(srv.url)
        used = [v for k, v in m.items() if k.startswith("edge_infer_kv_blocks_used")]
        if used and max(used) == 0:
            break
        time.sleep(0.2)
    assert used and max(used) == 0, m
