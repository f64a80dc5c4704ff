"""Continuous batching throughput and latency, side by side with static batching and with
llama.cpp serving the same requests one after another (what a Python user has today).

    python benchmarks/bench_batching.py [-m MODEL] [--workload decode-heavy] [--requests 16]
        [--scale 0.25] [--concurrency 1,4,16] [--static 16] [--threads 2] [--json] [--full] [--plot FILE.png]

Concurrency N keeps N requests in flight (a new one is added when one finishes). Static batching
runs batches of N until the longest request of the batch ends, in two forms: "static" is the
classic one (a fixed-shape batch: a finished row keeps its slot and is computed as padding until
the longest ends, as a [batch, length] generate loop does), "static, early exit" lets finished
rows leave the batch but still refills nothing. All requests are greedy with
ignore_eos, so every configuration generates exactly the same tokens. --full runs the issue's
matrix (64 requests, scale 1, concurrency 1,4,16,32). llama.cpp runs before and after edge-infer;
its row is the mean of both (each shown), so a machine that drifts shows as two baselines.
--plot draws throughput against concurrency: static batching as marks at its batch size, llama.cpp
sequential as a flat line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from edge_infer import hub
from edge_infer.bench.baseline import baseline_info, combine_runs, format_baseline, format_drift
from edge_infer.bench.serving import run_engine
from edge_infer.bench.workloads import BenchRequest, make_workload
from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine


def run_llama_cpp_sequential(path: str, reqs: list[BenchRequest], threads: int) -> dict | None:
    """llama.cpp (child process), one request after another, greedy, same lengths."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    spec = json.dumps([[r.prompt_token_ids, r.max_tokens] for r in reqs])
    for extra in ("1", "0"):  # its AMX path crashes on some CPUs: fall back to plain weights
        p = subprocess.run([sys.executable, str(Path(__file__).with_name("llama_cpp_sequential.py")), path,
                            str(threads), extra], input=spec, capture_output=True, text=True, timeout=7200)
        if p.returncode == 0 and p.stdout.strip():
            return json.loads(p.stdout.strip().splitlines()[-1])
    return {"error": f"llama.cpp exited with code {p.returncode}"}


def static_bound(lengths: list[int], batch: int) -> float:
    """What no scheduler keeping `batch` sequences in flight can beat over padded static
    batching of the same requests, when a padded row costs what a useful one does: the steps
    static batching runs (each batch as long as its longest request) over the steps with every
    slot always busy (total tokens / batch)."""
    static_steps = sum(max(lengths[i : i + batch]) for i in range(0, len(lengths), batch))
    return static_steps * batch / sum(lengths)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=hub.DEFAULT_MODEL)
    ap.add_argument("--workload", default="decode-heavy")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--scale", type=float, default=0.25, help="multiplies output lengths (1 = the issue's)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--static", type=int, default=16, help="static batch size (0: skip)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--full", action="store_true", help="64 requests, scale 1, concurrency 1,4,16,32")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", metavar="FILE.png", help="draw throughput against concurrency (matplotlib)")
    args = ap.parse_args()
    if args.plot:
        from edge_infer.bench.plot import check_plot_path

        check_plot_path(args.plot)
    if args.full:
        args.requests, args.scale, args.concurrency = 64, 1.0, "1,4,16,32"
    path = str(hub.resolve_model(args.model))
    concs = [int(c) for c in args.concurrency.split(",")]
    engine = LLMEngine(EngineConfig(model=path, n_threads=args.threads, max_num_seqs=max(concs + [args.static, 1]),
                                    kv_cache_memory=2 * 2**30))
    reqs = make_workload(args.workload, args.requests, engine.model_config.vocab_size, scale=args.scale)
    rows: dict[str, dict] = {}
    before = None if args.no_llama_cpp else run_llama_cpp_sequential(path, reqs, args.threads)
    for c in concs:
        rows[f"edge c={c}"] = run_engine(engine, reqs, c, static=False)
    if args.static:
        rows[f"edge static {args.static}"] = run_engine(engine, reqs, args.static, static=True, padded=True)
        rows[f"edge static {args.static} early exit"] = run_engine(engine, reqs, args.static, static=True)
    if before is not None:
        after = run_llama_cpp_sequential(path, reqs, args.threads) if "tokens_per_s" in before else None
        rows["llama.cpp sequential"] = combine_runs(before, after, ("tokens_per_s",)) or before
    if args.static:
        res_bound = static_bound([r.max_tokens for r in reqs], args.static)
    base = rows.get(f"edge c={concs[0]}", {}).get("tokens_per_s")
    res = {"model": args.model, "workload": args.workload, "requests": args.requests, "scale": args.scale,
           "threads": args.threads, "rows": rows}
    if args.static:
        res["static_bound"] = res_bound
    if not args.no_llama_cpp:
        res["llama_cpp_build"] = baseline_info()
    best = max((r["tokens_per_s"] for k, r in rows.items() if k.startswith("edge c=")), default=None)
    if base and best:
        res["ratios"] = {}
        # the targets compare concurrency 16 (when run) to the others; best is also shown
        for name, tps in (("c16", rows.get("edge c=16", {}).get("tokens_per_s")), ("best", best)):
            if not tps:
                continue
            res["ratios"][f"{name}_vs_c1"] = tps / base
            for key, label in ((f"edge static {args.static}", "static"),
                               (f"edge static {args.static} early exit", "static_early_exit"),
                               ("llama.cpp sequential", "llama_cpp_sequential")):
                if "tokens_per_s" in rows.get(key, {}):
                    res["ratios"][f"{name}_vs_{label}"] = tps / rows[key]["tokens_per_s"]
    if args.plot:
        from edge_infer.bench.plot import plot_throughput

        static = {k: (args.static, r["tokens_per_s"]) for k, r in rows.items() if k.startswith("edge static")}
        flat = {k: r["tokens_per_s"] for k, r in rows.items() if k.startswith("llama.cpp") and "tokens_per_s" in r}
        plot_throughput({"edge-infer continuous": {c: rows[f"edge c={c}"]["tokens_per_s"] for c in concs}}, flat,
                        args.plot, f"{args.model}, {args.workload}, {args.requests} requests, {args.threads} threads",
                        static)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{args.model}  workload={args.workload}  requests={args.requests}  scale={args.scale}  threads={args.threads}")
    print(f"{'config':30}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}")
    for k, r in rows.items():
        if "error" in r:
            print(f"{k:30} {r['error']}")
            continue
        print(f"{k:30}{r['tokens_per_s']:>9.1f}{r.get('ttft_p50_s', float('nan')):>10.2f}"
              f"{r.get('ttft_p99_s', float('nan')):>10.2f}{r.get('itl_p50_s', float('nan')) * 1000:>7.0f}ms"
              f"{r.get('itl_p99_s', float('nan')) * 1000:>7.0f}ms{format_drift(r, 'tokens_per_s')}")
    for k, v in res.get("ratios", {}).items():
        print(f"{k}: {v:.2f}x")
    if "llama_cpp_build" in res:
        print(format_baseline(res["llama_cpp_build"]))
    if args.static:
        print(f"bound on any scheduler at {args.static} sequences vs padded static batching: "
              f"{res['static_bound']:.2f}x (steps static runs / steps with every slot always busy)")


if __name__ == "__main__":
    main()
