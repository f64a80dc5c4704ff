"""Load test of `edge-infer serve`, side by side with llama.cpp's servers on the same workload:
its own `llama-server` with continuous batching (`-np N` slots, the main row; built by
`benchmarks/llama_cpp_build.py --tools`) and llama-cpp-python's `llama_cpp.server`.

    python benchmarks/bench_server.py [-m MODEL] [--requests 16] [--disconnects 4] [--concurrency N[,N..]]
        [--max-tokens 32] [--scale 0.25] [--threads 2] [--baseline llama-server,llama_cpp.server]
        [--llama-server PATH] [--no-llama-cpp] [--full] [--plot FILE.png] [--json]

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
Each llama.cpp server runs before and after edge-infer at each concurrency; its row is the mean
of both runs (each shown), so a machine that drifts shows as two baselines, not as a ratio.
--full: 64 clients + 20 disconnecting, up to 128 tokens, scale 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from ports import free_port  # noqa: E402,F401  (bench_cluster imports it from here)
from server_load import run_load  # noqa: E402

from edge_infer import hub  # noqa: E402
from edge_infer.bench.baseline import baseline_info, combine_runs, format_baseline, format_drift  # noqa: E402
from edge_infer.bench.workloads import make_workload  # noqa: E402
from edge_infer.tokenizer import Tokenizer  # noqa: E402

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


# -- servers ---------------------------------------------------------------------------------------
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
           "--max-queue", "4096"]
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
                 "False", "--port", str(port), "--host", "127.0.0.1"]
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
                       ) -> tuple[subprocess.Popen, str, str] | str:
    """llama.cpp's own server with continuous batching (-np slots, 2048 tokens each), ready and
    warmed up, or a sentence saying why not."""
    binary = llama_server_binary(args.llama_server)
    if binary is None or not binary.exists():
        return "llama-server is not built: run python benchmarks/llama_cpp_build.py --tools (or pass --llama-server)"
    port, n = free_port(), args.concurrency
    cmd = [str(binary), "-m", path, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-tb", str(args.threads), "-np", str(n), "-c", str(2048 * n),
           # an HTTP thread per client: with its default (one per core) a queued client's pooled
           # connection can be dropped unanswered, an error that is ours to avoid, not its
           "--threads-http", str(args.requests + args.disconnects + 4)]
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
            "kv_blocks_cached", "requests_aborted_total")
    return {k: m.get("edge_infer_" + k, float("nan")) for k in keys}


# -- main ------------------------------------------------------------------------------------------
def measure_baseline(name: str, path: str, args: argparse.Namespace, bodies: list[dict[str, Any]],
                     hang_ups: list[int], log_path: Path) -> dict[str, Any]:
    """One llama.cpp server started, loaded with the clients and stopped; {"error"} when it did not serve."""
    with open(log_path, "ab") as log:
        started = BASELINES[name](path, args, bodies[0], log)
        if isinstance(started, str):
            return {"error": started}
        proc, url, how = started
        try:
            row = asyncio.run(run_load(url, bodies, hang_ups, args.concurrency, args.timeout))
        finally:
            stop(proc)
    row["settings"] = how
    return row


def measure_at(conc: int, path: str, args: argparse.Namespace, bodies: list[dict[str, Any]], hang_ups: list[int],
               baselines: list[str], logs: Path) -> dict[str, Any]:
    """edge-infer serve and each baseline at `conc` clients in flight; every baseline runs before
    and after ours and its row is the mean of both (combine_runs)."""
    args.concurrency = conc
    before = {name: measure_baseline(name, path, args, bodies, hang_ups, logs / f"{name}.log") for name in baselines}
    rows: dict[str, Any] = {}
    with open(logs / "edge-infer.log", "ab") as log:
        proc, url = start_edge(path, args, log)
        try:
            warm_up(url, bodies[0])
            rows["edge-infer"] = asyncio.run(run_load(url, bodies, hang_ups, conc, args.timeout))
            rows["edge-infer"]["after"] = kv_after(url)
        finally:
            stop(proc)
        rows["edge-infer"]["exit_code"] = proc.returncode
    for name in baselines:
        after = (measure_baseline(name, path, args, bodies, hang_ups, logs / f"{name}.log")
                 if "tokens_per_s" in before[name] else None)
        rows[name] = combine_runs(before[name], after, ("tokens_per_s",)) or before[name]
    edge = rows["edge-infer"]
    ratios = {name: edge["tokens_per_s"] / rows[name]["tokens_per_s"] for name in baselines
              if edge.get("tokens_per_s") and rows[name].get("tokens_per_s")}
    return {"concurrency": conc, "rows": rows, "throughput_ratios": ratios}


def print_run(run: dict[str, Any]) -> None:
    rows = run["rows"]
    print(f"{'server':18}{'done':>6}{'gone':>6}{'err':>5}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}"
          f"{'ITL p50':>9}{'ITL p99':>9}{'wall':>8}   concurrency {run['concurrency']}")
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:18} {r['error']}")
            continue
        print(f"{name:18}{r['completed']:>6}{r['disconnected']:>6}{r['errors']:>5}{r['tokens_per_s']:>9.1f}"
              f"{r['ttft_p50_s']:>9.2f}s{r['ttft_p99_s']:>9.2f}s{r['itl_p50_s'] * 1000:>7.0f}ms"
              f"{r['itl_p99_s'] * 1000:>7.0f}ms{r['wall_s']:>7.1f}s{format_drift(r, 'tokens_per_s')}")
        for e in r["first_errors"]:
            print(f"  error: {e}")
    edge = rows["edge-infer"]
    if "after" in edge:
        a = edge["after"]
        print(f"edge-infer after the load: {a['num_requests_running']:.0f} running, {a['kv_blocks_used']:.0f} KV "
              f"blocks used ({a['kv_blocks_cached']:.0f} cached, unreferenced), "
              f"{a['requests_aborted_total']:.0f} aborted; exit code {edge.get('exit_code')}")
    for name, ratio in run["throughput_ratios"].items():
        print(f"throughput edge-infer / {name} ({rows[name]['settings']}): {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    ap.add_argument("--requests", type=int, default=16, help="streaming clients that complete (default 16)")
    ap.add_argument("--disconnects", type=int, default=4, help="clients that hang up mid-stream (default 4)")
    ap.add_argument("--concurrency", default="0",
                    help="completing clients in flight, a list runs each (default 0: all; llama-server gets -np N)")
    ap.add_argument("--max-tokens", type=int, default=32, help="cap on each output length (default 32)")
    ap.add_argument("--scale", type=float, default=0.25, help="scales the workload's lengths (default 0.25)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="bound on each wait in seconds")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip every llama.cpp baseline")
    ap.add_argument("--baseline", default="llama-server,llama_cpp.server",
                    help="llama.cpp servers to compare with, in order (default llama-server,llama_cpp.server)")
    ap.add_argument("--llama-server", help="path of llama-server (default: the one llama_cpp_build.py --tools built)")
    ap.add_argument("--full", action="store_true", help="64 clients + 20 disconnecting, 128 tokens, scale 1")
    ap.add_argument("--plot", metavar="FILE.png", help="draw throughput against concurrency (matplotlib)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.full:
        args.requests, args.disconnects, args.max_tokens, args.scale = 64, 20, 128, 1.0
    try:
        concs = [int(c) or args.requests for c in args.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency must be a comma-separated list of integers, got {args.concurrency!r}")
    if min(concs) < 1:
        ap.error("--concurrency values must be at least 1 (0: all clients)")
    baselines = [] if args.no_llama_cpp else [b.strip() for b in args.baseline.split(",") if b.strip()]
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        ap.error(f"unknown --baseline {', '.join(unknown)} (known: {', '.join(BASELINES)})")
    if args.plot:
        from edge_infer.bench.plot import check_plot_path

        check_plot_path(args.plot)
    path = str(hub.resolve_model(args.model))
    tok = Tokenizer.from_gguf(path)
    reqs = make_workload("mixed", args.requests, tok.vocab_size, seed=0, scale=args.scale)
    ban = {str(t): -100 for t in sorted(tok.stop_ids)}
    bodies = [{"prompt": tok.decode(r.prompt_token_ids), "max_tokens": min(r.max_tokens, args.max_tokens),
               "temperature": 0, "stream": True, "logit_bias": ban} for r in reqs]
    hang_ups = [random.Random(i).randint(1, 5) for i in range(args.disconnects)]
    logs = Path(f"/tmp/bench_server-{time.strftime('%Y%m%d-%H%M%S')}")
    logs.mkdir(parents=True, exist_ok=True)
    runs = [measure_at(c, path, args, bodies, hang_ups, baselines, logs) for c in concs]
    res = {"model": args.model, "requests": args.requests, "disconnects": args.disconnects,
           "max_tokens": args.max_tokens, "scale": args.scale, "threads": args.threads, "logs": str(logs),
           "runs": runs, "llama_cpp_build": baseline_info() if baselines else None}
    if args.plot:
        from edge_infer.bench.plot import plot_throughput

        series = {name: {r["concurrency"]: r["rows"][name]["tokens_per_s"] for r in runs
                         if "tokens_per_s" in r["rows"].get(name, {})} for name in ["edge-infer", *baselines]}
        plot_throughput({k: v for k, v in series.items() if v}, {}, args.plot,
                        f"{args.model}, {args.requests} streaming clients (+{args.disconnects} hanging up), "
                        f"{args.threads} threads")
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.model}  clients={args.requests}+{args.disconnects} disconnecting  max_tokens={args.max_tokens}  "
          f"scale={args.scale}  threads={args.threads}")
    for run in runs:
        print_run(run)
    if baselines:
        print(format_baseline(res["llama_cpp_build"]))


if __name__ == "__main__":
    main()
