"""Ray Serve's overhead: `edge-infer serve --replicas 1 -t 2` against the plain `edge-infer serve
-t 2`, same model, 16 concurrent streams, alternating runs; and the CPU each Ray process used
during the cluster's runs (proxy, controller, GCS, raylet, ingress, engine replica).

    python benchmarks/bench_cluster.py [-m smollm2-135m] [--requests 64] [--rounds 2] [--json FILE]

Target (issue): the cluster keeps >= 85% of the plain server's aggregate tokens/s. Run it alone
on the machine: both servers share its cores with the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import free_port, stop, wait_http, warm_up  # noqa: E402
from server_load import run_load  # noqa: E402

from edge_infer import hub  # noqa: E402

RAY_ROLES = (("ServeReplica:edge-infer:engine", "engine replica"), ("ServeReplica:edge-infer:ingress", "ingress"),
             ("ProxyActor", "HTTP proxy"), ("ServeController", "Serve controller"), ("gcs_server", "GCS"),
             ("raylet", "raylet"), ("dashboard", "dashboard"), ("log_monitor", "log monitor"))


def wait_ray_gone(timeout: float = 60) -> None:
    """Until the previous run's Ray processes have exited (they would share the cores)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(role(p) for p in psutil.process_iter()):
        time.sleep(0.5)


def role(p: psutil.Process) -> str | None:
    try:
        text = " ".join(p.cmdline()) + " " + p.name()
    except psutil.Error:
        return None
    return next((name for key, name in RAY_ROLES if key in text), None)


def cpu_by_role() -> dict[str, float]:
    out: dict[str, float] = {}
    for p in psutil.process_iter():
        r = role(p)
        if r is not None:
            try:
                t = p.cpu_times()
                out[r] = out.get(r, 0.0) + t.user + t.system
            except psutil.Error:
                pass
    return out


def start(model: Path, cluster: bool, log: Any) -> tuple[subprocess.Popen, str]:
    wait_ray_gone()
    port = free_port()
    cmd = [sys.executable, "-m", "edge_infer.cli", "serve", "-m", str(model), "--port", str(port), "-t", "2",
           "--max-num-seqs", "16", "--max-model-len", "2048", "--kv-cache-memory", "512MiB", "--max-queue", "4096",
           "--served-model-name", "m"]
    if cluster:
        cmd += ["--replicas", "1"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if not wait_http(proc, url + "/health", 600):
        stop(proc)
        raise SystemExit(f"the {'cluster' if cluster else 'plain'} server did not start (log: {log.name})")
    return proc, url


def measure(model: Path, cluster: bool, bodies: list[dict[str, Any]], log: Any) -> dict[str, Any]:
    proc, url = start(model, cluster, log)
    try:
        warm_up(url, bodies[0])
        before, t0 = cpu_by_role(), time.monotonic()
        run = asyncio.run(run_load(url, bodies, [], 16, 600))
        wall = time.monotonic() - t0
        after = cpu_by_role()
        run["ray_cpu_share"] = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / wall for k in after} if cluster else {}
        return run
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    model = hub.resolve_model(args.model)
    bodies = [{"model": "m", "prompt": f"Story number {i}: once upon a time", "max_tokens": args.max_tokens,
               "temperature": 0.0, "ignore_eos": True, "stream": True} for i in range(args.requests)]
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "cluster": []}
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as log:
        for _ in range(args.rounds):  # alternate, so drift shows in both
            for name in ("plain", "cluster"):
                runs[name].append(measure(model, name == "cluster", bodies, log))
    rate = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    errors = sum(r["errors"] for v in runs.values() for r in v)
    share = runs["cluster"][-1]["ray_cpu_share"]
    print(f"{'server':<10}{'tokens/s (median)':>20}{'TTFT p50 ms':>14}   runs")
    for k, v in runs.items():
        ttft = statistics.median(r["ttft_p50_s"] for r in v) * 1000
        each = ", ".join(f"{r['tokens_per_s']:.1f}" for r in v)
        print(f"{k:<10}{rate[k]:>20.1f}{ttft:>14.0f}   {each}")
    if errors:
        print("errors:", [e for v in runs.values() for r in v for e in r["first_errors"]][:3])
    ratio = rate["cluster"] / rate["plain"] if rate["plain"] else float("nan")
    print(f"cluster / plain: {ratio:.3f} (target >= 0.85); errors: {errors}")
    print("CPU per Ray process during the last cluster run (cores):")
    for k, v in sorted(share.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<18}{v:6.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "median_tokens_per_s": rate,
                                               "ratio": ratio}, indent=2))
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
