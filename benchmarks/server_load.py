"""The client side of benchmarks/bench_server.py: streaming completions against an
OpenAI-compatible server, each stream's SSE framing checked, TTFT and inter-chunk gaps timed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np


@dataclass
class Client:
    ok: bool = False
    error: str | None = None
    tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    end: float = 0.0


async def stream_one(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], hang_up_after: int | None
) -> Client:
    """One streaming completion; checks the SSE framing. hang_up_after: disconnect after that many chunks."""
    res, start, last = Client(), time.monotonic(), None
    finish, done, chunks = None, False, 0
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line or line.startswith(":"):  # blank separators, SSE comments (keep-alive pings)
                    continue
                if not line.startswith("data: ") or done:
                    res.error = f"bad framing: {line[:80]!r}"
                    break
                if line == "data: [DONE]":
                    done = True
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    res.error = f"error event: {obj['error']}"
                    break
                now = time.monotonic()
                for c in obj.get("choices", []):
                    if c.get("text"):
                        chunks += 1
                        if last is None:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last = now
                    if c.get("finish_reason"):
                        if finish is not None:
                            res.error = "two finish_reasons"
                        finish = c["finish_reason"]
                if hang_up_after is not None and chunks >= hang_up_after:
                    res.ok, res.end = True, time.monotonic()
                    return res  # leaving the block closes the connection mid-stream
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.end = time.monotonic()
    if res.error is None and hang_up_after is None:
        res.error = None if done and finish else "no [DONE]" if not done else "no finish_reason"
    res.ok = res.error is None
    res.tokens = body["max_tokens"] if finish == "length" else chunks
    return res


async def run_load(url: str, bodies: list[dict[str, Any]], hang_ups: list[int], concurrency: int,
                   timeout: float) -> dict[str, Any]:
    # a fresh connection per request: a pooled one idle past a server's keep-alive timeout (cpp-httplib:
    # 5 s, while a client waits its turn) is closed under it and the request fails unanswered
    limits = httpx.Limits(max_connections=len(bodies) + len(hang_ups) + 4, max_keepalive_connections=0)
    gate = asyncio.Semaphore(concurrency)

    async def complete(http: httpx.AsyncClient, body: dict[str, Any]) -> Client:
        async with gate:
            return await stream_one(http, url, body, None)

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as http:
        t0 = time.monotonic()
        long = 4 * max(b["max_tokens"] for b in bodies) + 64  # hang-up clients would run long
        rest = [
            stream_one(http, url, {**bodies[i % len(bodies)], "max_tokens": long}, k)
            for i, k in enumerate(hang_ups)
        ]
        results = await asyncio.wait_for(asyncio.gather(*(complete(http, b) for b in bodies), *rest), timeout)
    done, gone = results[: len(bodies)], results[len(bodies) :]
    wall = max(c.end for c in done) - t0
    tokens = sum(c.tokens for c in done if c.ok)
    ttft = [c.ttft for c in done if c.ttft is not None]
    itl = [x for c in done for x in c.itl]
    errors = [c.error for c in done + gone if c.error]

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) if xs else float("nan")

    return {"completed": sum(c.ok for c in done), "disconnected": sum(c.ok for c in gone), "errors": len(errors),
            "first_errors": errors[:3], "output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "itl_p50_s": pct(itl, 50),
            "itl_p99_s": pct(itl, 99)}
