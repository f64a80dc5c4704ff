"""Load test of `edge-infer serve`, side by side with llama.cpp's servers on the same workload:
its own `llama-server` with continuous batching (`-np N` slots, the main row; built by
`benchmarks/llama_cpp_build.py --tools`) and llama-cpp-python's `llama_cpp.server`.

    python benchmarks/bench_server.py [-m MODEL] [--requests 16] [--disconnects 4] [--concurrency N]
        [--max-tokens 32] [--scale 0.25] [--threads 2] [--baseline llama-server,llama_cpp.server]
        [--llama-server PATH] [--no-llama-cpp] [--full] [--json]

`--requests` streaming clients (the "mixed" workload of edge_infer.bench.workloads: mixed prompt and
output lengths, outputs capped at --max-tokens; greedy, with the end-of-generation tokens banned through
logit_bias so that every request runs to its length on both servers) plus `--disconnects`
clients that hang up after a few chunks, all started at once (at most --concurrency completing
clients in flight). Every completing stream must be HTTP 200, `data: {...}` chunks without an
error, one finish_reason, `data: [DONE]` last. For edge-infer, /metrics must then show no
running request and no KV block in use (cached blocks without references may stay).
Reported: output tokens/s (the completing clients' tokens / wall time), TTFT and the gaps
between content chunks (ITL) at p50 / p99, as the clients see them.

llama_cpp.server runs one request at a time (--interrupt_requests False). Its AMX weight
repacking crashes on some CPUs: if the warm-up request kills it, it is restarted with
use_extra_bufts = False, and the row says so. Loopback only; every wait is bounded (--timeout).
--full: 64 clients + 20 disconnecting, up to 128 tokens, scale 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from edge_infer import hub
from edge_infer.bench.baseline import baseline_info, format_baseline
from edge_infer.bench.workloads import make_workload
from edge_infer.tokenizer import Tokenizer

# llama_cpp.server with the model loaded without extra (AMX / repacked) buffer types.
_LLAMA_SAFE = """
import runpy, sys
import llama_cpp.llama_cpp as L
_default = L.llama_model_default_params
def _params():
    p = _default()
    p.use_extra_bufts = False
    return p
L.llama_model_default_params = _params
sys.argv = ["llama_cpp.server", *sys.argv[1:]]
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


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
                   timeout: float) -> dict[str, Any]:  # fmt: skip
    limits = httpx.Limits(max_connections=len(bodies) + len(hang_ups) + 4)
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
            "itl_p99_s": pct(itl, 99)}  # fmt: skip


# -- servers ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(proc: subprocess.Popen, url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return False


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def warm_up(url: str, body: dict[str, Any]) -> bool:
    try:
        r = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 4, "stream": False}, timeout=300)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def start_edge(path: str, args: argparse.Namespace, log: Any) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "edge_infer.cli", "serve", "-m", path, "--port", str(port), "-t", str(args.threads),
           "--max-num-seqs", str(args.concurrency), "--max-model-len", "2048", "--kv-cache-memory", "1GiB",
           "--max-queue", "4096"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if not wait_http(proc, url + "/health", args.timeout):
        stop(proc)
        raise SystemExit(f"edge-infer serve did not become ready (log: {log.name})")
    return proc, url


def start_llama(
    path: str, args: argparse.Namespace, body: dict[str, Any], log: Any
) -> tuple[subprocess.Popen, str, str] | str:
    """llama_cpp.server ready and warmed up, or a sentence saying why not."""
    for safe in (False, True):
        port = free_port()
        flags = ["--model", path, "--n_threads", str(args.threads), "--n_ctx", "2048", "--interrupt_requests",
                 "False", "--port", str(port), "--host", "127.0.0.1"]  # fmt: skip
        cmd = (
            [sys.executable, "-c", _LLAMA_SAFE, *flags]
            if safe
            else [sys.executable, "-m", "llama_cpp.server", *flags]
        )
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        if wait_http(proc, url + "/v1/models", args.timeout) and warm_up(url, body):
            return proc, url, "use_extra_bufts=False (the default AMX path crashed)" if safe else "defaults"
        stop(proc)
        if proc.returncode not in (None, 0) and proc.returncode < 0:
            log.write(f"\n[bench] llama_cpp.server died with signal {-proc.returncode}\n".encode())
            log.flush()
    return f"llama_cpp.server failed to serve (see {log.name})"


def llama_server_binary(explicit: str | None) -> Path | None:
    """--llama-server PATH, else the one benchmarks/llama_cpp_build.py --tools built for this host."""
    if explicit:
        return Path(explicit)
    import llama_cpp_build

    built = llama_cpp_build.cache_dir(llama_cpp_build.host_cmake_flags()) / "bin" / "llama-server"
    return built if built.exists() else None


def start_llama_server(path: str, args: argparse.Namespace, body: dict[str, Any], log: Any
                       ) -> tuple[subprocess.Popen, str, str] | str:  # fmt: skip
    """llama.cpp's own server with continuous batching (-np slots, 2048 tokens each), ready and
    warmed up, or a sentence saying why not."""
    binary = llama_server_binary(args.llama_server)
    if binary is None or not binary.exists():
        return "llama-server is not built: run python benchmarks/llama_cpp_build.py --tools (or pass --llama-server)"
    port, n = free_port(), args.concurrency
    cmd = [str(binary), "-m", path, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-tb", str(args.threads), "-np", str(n), "-c", str(2048 * n)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if wait_http(proc, url + "/health", args.timeout) and warm_up(url, body):
        return proc, url, f"-np {n} (continuous batching), -c {2048 * n}, -t {args.threads}"
    stop(proc)
    return f"llama-server failed to serve (see {log.name})"


BASELINES = {"llama-server": start_llama_server, "llama_cpp.server": start_llama}


def kv_after(url: str, timeout: float = 30.0) -> dict[str, float]:
    """Running requests and KV blocks in use once the clients are done (waits for aborts to land)."""
    from edge_infer.server.metrics import parse

    deadline, m = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        m = parse(httpx.get(url + "/metrics", timeout=30).text)
        if m.get("edge_infer_num_requests_running", 1) == 0 and m.get("edge_infer_kv_blocks_used", 1) == 0:
            break
        time.sleep(0.1)
    keys = ("num_requests_running", "num_requests_waiting", "num_requests_in_flight", "kv_blocks_used",
            "kv_blocks_cached", "requests_aborted_total")  # fmt: skip
    return {k: m.get("edge_infer_" + k, float("nan")) for k in keys}


# -- main ------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=16, help="streaming clients that complete (default 16)")
    ap.add_argument("--disconnects", type=int, default=4, help="clients that hang up mid-stream (default 4)")
    ap.add_argument("--concurrency", type=int, default=0, help="completing clients in flight (default: all)")
    ap.add_argument("--max-tokens", type=int, default=32, help="cap on each output length (default 32)")
    ap.add_argument("--scale", type=float, default=0.25, help="scales the workload's lengths (default 0.25)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="bound on each wait in seconds")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip every llama.cpp baseline")
    ap.add_argument("--baseline", default="llama-server,llama_cpp.server",
                    help="llama.cpp servers to compare with, in order (default llama-server,llama_cpp.server)")
    ap.add_argument("--llama-server", help="path of llama-server (default: the one llama_cpp_build.py --tools built)")
    ap.add_argument("--full", action="store_true", help="64 clients + 20 disconnecting, 128 tokens, scale 1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.full:
        args.requests, args.disconnects, args.max_tokens, args.scale = 64, 20, 128, 1.0
    args.concurrency = args.concurrency or args.requests
    baselines = [b.strip() for b in args.baseline.split(",") if b.strip()]
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        ap.error(f"unknown --baseline {', '.join(unknown)} (known: {', '.join(BASELINES)})")
    path = str(hub.resolve_model(args.model))
    tok = Tokenizer.from_gguf(path)
    reqs = make_workload("mixed", args.requests, tok.vocab_size, seed=0, scale=args.scale)
    ban = {str(t): -100 for t in sorted(tok.stop_ids)}
    bodies = [{"prompt": tok.decode(r.prompt_token_ids), "max_tokens": min(r.max_tokens, args.max_tokens),
               "temperature": 0, "stream": True, "logit_bias": ban} for r in reqs]  # fmt: skip
    hang_ups = [random.Random(i).randint(1, 5) for i in range(args.disconnects)]
    rows: dict[str, Any] = {}
    logs = Path(f"/tmp/bench_server-{time.strftime('%Y%m%d-%H%M%S')}")
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "edge-infer.log", "wb") as log:
        proc, url = start_edge(path, args, log)
        try:
            warm_up(url, bodies[0])
            rows["edge-infer"] = asyncio.run(run_load(url, bodies, hang_ups, args.concurrency, args.timeout))
            rows["edge-infer"]["after"] = kv_after(url)
        finally:
            stop(proc)
        rows["edge-infer"]["exit_code"] = proc.returncode
    for name in [] if args.no_llama_cpp else baselines:
        with open(logs / f"{name}.log", "wb") as log:
            started = BASELINES[name](path, args, bodies[0], log)
            if isinstance(started, str):
                rows[name] = {"error": started}
                continue
            proc, url, how = started
            try:
                rows[name] = asyncio.run(run_load(url, bodies, hang_ups, args.concurrency, args.timeout))
                rows[name]["settings"] = how
            finally:
                stop(proc)
    res = {"model": args.model, "requests": args.requests, "disconnects": args.disconnects,
           "concurrency": args.concurrency, "max_tokens": args.max_tokens, "scale": args.scale,
           "threads": args.threads, "logs": str(logs), "rows": rows}  # fmt: skip
    edge = rows.get("edge-infer", {})
    res["throughput_ratios"] = {name: edge["tokens_per_s"] / rows[name]["tokens_per_s"] for name in baselines
                                if edge.get("tokens_per_s") and rows.get(name, {}).get("tokens_per_s")}  # fmt: skip
    if not args.no_llama_cpp:
        res["llama_cpp_build"] = baseline_info()
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.model}  clients={args.requests}+{args.disconnects} disconnecting  concurrency={args.concurrency}  "
          f"max_tokens={args.max_tokens}  scale={args.scale}  threads={args.threads}")  # fmt: skip
    print(f"{'server':18}{'done':>6}{'gone':>6}{'err':>5}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
          f"{'ITL p50':>9}{'ITL p99':>9}{'wall':>8}")  # fmt: skip
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:18} {r['error']}")
            continue
        print(f"{name:18}{r['completed']:>6}{r['disconnected']:>6}{r['errors']:>5}{r['tokens_per_s']:>9.1f}"
              f"{r['ttft_p50_s']:>9.2f}s{r['ttft_p99_s']:>9.2f}s{r['itl_p50_s'] * 1000:>7.0f}ms"
              f"{r['itl_p99_s'] * 1000:>7.0f}ms{r['wall_s']:>7.1f}s")  # fmt: skip
        for e in r["first_errors"]:
            print(f"  error: {e}")
    if "after" in edge:
        a = edge["after"]
        print(f"edge-infer after the load: {a['num_requests_running']:.0f} running, {a['kv_blocks_used']:.0f} KV "
              f"blocks used ({a['kv_blocks_cached']:.0f} cached, unreferenced), "
              f"{a['requests_aborted_total']:.0f} aborted; exit code {edge.get('exit_code')}")  # fmt: skip
    for name, ratio in res["throughput_ratios"].items():
        print(f"throughput edge-infer / {name} ({rows[name]['settings']}): {ratio:.2f}x")
    if "llama_cpp_build" in res:
        print(format_baseline(res["llama_cpp_build"]))


if __name__ == "__main__":
    main()
