"""`edge-infer serve --replicas` on a local Ray cluster (loopback only; every loop bounded):
the official openai client's streams complete with the plain server's greedy text, a replica
killed with SIGKILL mid-load fails only its own requests (OpenAI-shaped, no hang) and comes
back, and requests sharing a long prefix are steered to the replica that holds it (the prefix
cache serves their shared tokens: usage.prompt_tokens_details.cached_tokens). The killed replica's errors name no pid, address or actor id; a local
cluster on 127.0.0.1 listens on loopback only and keeps its token file private (issue #33)."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
from cluster_helpers import busiest, chat, engine_pids, wait_for  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(start_server: Callable[..., Any], smollm2_path: Path) -> Any:
    return start_server(smollm2_path, "--replicas", "2", "-t", "1", "--served-model-name", "m",
                        "--kv-cache-memory", "64MiB")


def test_two_replicas_stream_the_plain_servers_greedy_text(
    cluster: Any, start_server: Callable[..., Any], smollm2_path: Path
) -> None:
    prompts = [f"Name a colour and the number {i}." for i in range(32)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda p: chat(cluster.url, p), prompts))
    assert len(engine_pids()) == 2
    plain = start_server(smollm2_path, "-t", "1", "--served-model-name", "m", "--kv-cache-memory", "64MiB")
    want = [chat(plain.url, p) for p in prompts[:8]]
    plain.stop()
    assert got[:8] == want and all(got)
    assert httpx.get(cluster.url + "/metrics", timeout=30).status_code == 200


def test_prefix_affinity_keeps_a_shared_prefix_on_one_replica(cluster: Any) -> None:
    text = Path("/usr/share/common-licenses/GPL-3").read_text()[:4500]  # ~1,000 tokens
    body = {"model": "m", "max_tokens": 1, "temperature": 0}
    cached = []
    for i in range(8):
        r = httpx.post(cluster.url + "/v1/completions", json={**body, "prompt": text + f"\nQuestion {i}:"},
                       timeout=300)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] >= 900
        cached.append(usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"])
    # The first computes the prefix; had any later one gone to the other replica, it would
    # have computed it again: each computes only its last block (16 tokens) and the question
    assert cached[0] >= 900 and max(cached[1:]) <= 16 + 8, cached


def test_ray_listens_on_loopback_and_keeps_its_token_private(cluster: Any) -> None:
    import psutil

    procs = [psutil.Process(cluster.proc.pid), *psutil.Process(cluster.proc.pid).children(recursive=True)]
    listening = []
    for p in procs:  # the server, Ray's GCS, raylet, agents, workers and Serve's proxy
        try:
            listening += [(p.name(), c.laddr) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            pass
    assert len(listening) >= 5, listening
    outside = [(name, a) for name, a in listening if not ipaddress.ip_address(a.ip.removeprefix("::ffff:")).is_loopback]
    # Serve hard-codes its replicas' inter-deployment gRPC server on [::] (token-authenticated;
    # docs/scale-out.md): one such port per replica (2 engines, 1 ingress), nothing else
    assert len(outside) <= 3 and all(name.startswith("ray::ServeReplica:") for name, _ in outside), outside
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    assert token.stat().st_mode & 0o777 == 0o600, oct(token.stat().st_mode)


def test_a_killed_replica_fails_only_its_requests_and_comes_back(cluster: Any) -> None:
    pids = engine_pids()
    assert len(pids) == 2
    results: list[str | BaseException] = []
    started = threading.Semaphore(0)

    def one(i: int) -> None:
        try:
            # long enough to be cut (at full speed a replica streams 120 tokens to each of three in
            # ~3 s), short enough that the survivor ends its own while the killed one restarts
            results.append(chat(cluster.url, f"Write a long story about the number {i}.", max_tokens=120,
                                timeout=90, ignore_eos=True, on_first=started.release))
        except Exception as e:  # the client's error for a failed request
            results.append(e)

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(one, i) for i in range(6)]
        for _ in range(6):  # every request streaming: each replica holds its share now
            assert started.acquire(timeout=60), "a request streamed nothing for 60 s"
        victim = busiest(pids, 0.2)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        for f in futures:
            f.result(timeout=120)  # no client waits forever
    assert time.monotonic() - t0 < 100
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(results) == 6 and 1 <= len(errors) < 6, results  # the killed one held some, not all
    for e in errors:  # OpenAI-shaped: the client parsed an API error (a status or an error event)
        assert isinstance(e, openai.APIError), repr(e)
        said = f"{e} {getattr(e, 'body', '')}"  # nothing of the replica's process, node or actor
        assert str(victim) not in said and not re.search(r"\d+\.\d+\.\d+\.\d+|pid|actor|ip:", said), said
        assert "replica failed" in said, said
    assert chat(cluster.url, "Hello again.", stream=False)  # later requests succeed
    wait_for(lambda: len(engine_pids()) == 2 and victim not in engine_pids(), 180, "the replica to restart")
