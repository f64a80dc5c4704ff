"""A bounded soak of the server (loopback only, ends by itself): N streaming clients for a few
minutes, a quarter of the streams dropped mid-way, malformed requests mixed in, a KV pool small
enough that the load preempts. Reports every outcome, the server's RSS from minute 2 to the
end, its threads at rest and the KV blocks still referenced afterwards.

    python benchmarks/soak_server.py [-m smollm2-135m] [--minutes 10] [--clients 32] [--json]

Every well-formed request must complete or be refused cleanly (429/503); malformed ones get a
4xx; anything else is a failure. Targets: RSS growth <= 5% from minute 2, zero KV blocks and no
extra threads at rest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from conftest import launch, read_metrics  # noqa: E402

MALFORMED = [b'{"prompt": "x", "max_tokens": ', b'{"prompt": "x", "temperature": "hot"}', b"[1, 2]",
             b'{"messages": [{"role": "wizard", "content": "x"}]}', b'{"prompt": "x", "frobnicate": 1}']


async def client(url: str, until: float, rng: random.Random, out: Counter) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        while time.monotonic() < until:
            roll = rng.random()
            if roll < 0.1:  # malformed
                r = await http.post("/v1/completions", content=rng.choice(MALFORMED),
                                    headers={"content-type": "application/json"})
                out["malformed 4xx" if 400 <= r.status_code < 500 else f"FAIL malformed {r.status_code}"] += 1
                continue
            body = {"prompt": "Tell me a story about " + rng.choice(["a cat", "the sea", "a robot", "bread"]),
                    "max_tokens": rng.randint(16, 128), "temperature": 0.8, "stream": True}
            drop_after = rng.randint(1, 8) if rng.random() < 0.25 else None
            try:
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    if r.status_code in (429, 503):
                        out["refused"] += 1
                        continue
                    if r.status_code != 200:
                        out[f"FAIL status {r.status_code}"] += 1
                        continue
                    n, done = 0, False
                    async for line in r.aiter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            if '"error"' in line:
                                out["FAIL error event"] += 1
                            n += 1
                            if drop_after is not None and n >= drop_after:
                                break
                    out["dropped mid-stream" if drop_after is not None and not done else
                        "completed" if done else "FAIL stream ended early"] += 1
            except httpx.HTTPError as e:
                out[f"FAIL {type(e).__name__}"] += 1


async def soak(url: str, seconds: float, clients: int, proc: psutil.Process) -> tuple[Counter, list[tuple[float, int, int]]]:
    out: Counter = Counter()
    samples: list[tuple[float, int, int]] = []  # (seconds, RSS bytes, threads)
    t0 = time.monotonic()
    until = t0 + seconds

    async def sampler() -> None:
        while time.monotonic() < until:
            samples.append((time.monotonic() - t0, proc.memory_info().rss, proc.num_threads()))
            await asyncio.sleep(5)

    await asyncio.gather(sampler(), *(client(url, until, random.Random(i), out) for i in range(clients)))
    return out, samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logs = Path("/tmp/edge-infer-soak")
    logs.mkdir(exist_ok=True)
    srv = launch(a.model, "-t", "2", "--kv-cache-memory", "12MiB", "--max-model-len", "512", "--max-num-seqs", "16",
                 "--max-queue", "64", log_dir=logs)
    try:
        proc = psutil.Process(srv.proc.pid)
        outcomes, samples = asyncio.run(soak(srv.url, a.minutes * 60, a.clients, proc))
        time.sleep(3)  # the aborted streams' requests are gone by now
        m = read_metrics(srv.url)
        kv_used = m.get("edge_infer_kv_blocks_used", float("nan"))
        running = m.get("edge_infer_num_requests_running", float("nan"))
        preempted = sum(v for k, v in m.items() if "preempt" in k)
        threads_after = proc.num_threads()
        healthy = httpx.get(srv.url + "/health", timeout=30).status_code == 200
    finally:
        srv.stop()
    warm = [smp for smp in samples if smp[0] >= 120] or samples  # from minute 2 (the whole run if shorter)
    after2 = [rss for _, rss, _ in warm]
    threads_idle = max(th for _, _, th in warm)  # under load, once warm: the pools exist by then
    growth = (after2[-1] - after2[0]) / after2[0] if after2 else float("nan")
    failures = sum(v for k, v in outcomes.items() if k.startswith("FAIL"))
    res = {"minutes": a.minutes, "clients": a.clients, "outcomes": dict(outcomes), "failures": failures,
           "rss_mb_from_minute_2": [after2[0] / 2**20, after2[-1] / 2**20], "rss_growth": growth,
           "kv_blocks_used_at_rest": kv_used, "running_at_rest": running, "preemptions": preempted,
           "threads_under_load": threads_idle, "threads_at_rest_after": threads_after, "healthy": healthy}
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{a.clients} clients for {a.minutes:g} min: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
        print(f"failures {failures}; RSS {after2[0] / 2**20:.0f} -> {after2[-1] / 2**20:.0f} MB from minute 2 "
              f"({growth:+.1%}); at rest: {kv_used:g} KV blocks, {running:g} running, threads {threads_after} "
              f"(at most {threads_idle} under load); preemptions {preempted:g}; healthy {healthy}")
    return 1 if failures or kv_used != 0 or not healthy else 0


if __name__ == "__main__":
    sys.exit(main())
