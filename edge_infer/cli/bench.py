"""`edge-infer bench`: prefill and decode speed, side by side with llama.cpp in the same run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from edge_infer.cli.args import add_kv_type_args, kv_type_options
from edge_infer.errors import EdgeInferError, InvalidRequest
from edge_infer.hub import DEFAULT_MODEL


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", parents=parents, help="prefill/decode tokens/s, with llama.cpp side by side",
        description="Measure prefill (ppN: an N-token prompt) and decode (tgN: N greedy tokens after it) "
        "tokens/s; with llama-cpp-python installed, llama.cpp on the same model, prompt and threads in "
        "the same run. Figures are medians of --repetitions runs.",
    )
    p.add_argument("-m", "--model", nargs="+", default=[DEFAULT_MODEL], metavar="MODEL",
                   help=f"known names or .gguf paths, measured one after another (default {DEFAULT_MODEL})")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens (default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp side")
    add_kv_type_args(p)
    p.add_argument("--ik-llama-bench", metavar="PATH", default=None,
                   help="also run ik_llama.cpp's llama-bench binary (-rtr 1) on the same file, prompt, length and "
                   "threads, and show its row and our ratio to it")
    p.add_argument("--workload", metavar="NAME", default=None,
                   help="instead of pp/tg: serve a workload (decode-heavy, mixed, decode-heavy-poisson, "
                   "mixed-poisson) and report throughput, TTFT and inter-token latency")
    p.add_argument("--concurrency", default="1,4,16", help="with --workload: requests in flight (list, default 1,4,16)")
    p.add_argument("--requests", type=int, default=16, help="with --workload: number of requests (default 16)")
    p.add_argument("--scale", type=float, default=0.25, help="with --workload: output-length scale (1 = full)")
    p.add_argument("--json", action="store_true", help="print a JSON object (a list of them for several models)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="also draw the figures: pp/tg per model beside llama.cpp, or with --workload "
                   "throughput against concurrency (needs matplotlib: the [bench] extra)")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from edge_infer.bench.pp_tg import BenchConfig, format_table, run
    from edge_infer.config import default_threads

    for name in ("n_prompt", "n_gen", "repetitions"):
        if getattr(args, name) < 1:
            raise InvalidRequest(f"--{name.replace('_', '-')} must be at least 1")
    threads = args.threads or default_threads()
    if threads < 1:
        raise InvalidRequest("--threads must be at least 1")
    if args.plot is not None:
        from edge_infer.bench.plot import check_plot_path

        check_plot_path(args.plot)
    ik = None
    if args.ik_llama_bench is not None:
        from edge_infer.bench.ik_llama import check_llama_bench

        ik = check_llama_bench(args.ik_llama_bench)
    if args.workload is not None:
        if ik is not None:
            raise InvalidRequest("--ik-llama-bench compares pp/tg: it does not combine with --workload")
        return _cmd_workload(args, threads)
    results = []
    for model in args.model:
        kv = kv_type_options(args)
        cfg = BenchConfig(model, threads, args.n_prompt, args.n_gen, args.repetitions, not args.no_llama_cpp,
                          ik_llama_bench=ik, kv_cache_dtype=kv.get("kv_cache_dtype", "f16"),
                          kv_cache_dtype_v=kv.get("kv_cache_dtype_v"))
        # several models: each in a fresh process, so that none runs in the memory and thread
        # state the previous one left (measured: smollm2 decoded at 76 tok/s after three larger
        # models in the same process, 131 alone)
        res = run(cfg) if len(args.model) == 1 else _run_in_child(cfg)
        results.append(res)
        if not args.json:
            print(format_table(res), flush=True)
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
    if args.plot is not None:
        from edge_infer.bench.plot import plot_pp_tg

        print(f"chart: {plot_pp_tg(results, args.plot)}")
    return 0


def _run_in_child(cfg: Any) -> dict[str, Any]:
    """`edge-infer bench --json` for one model in a child process; its result object."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "edge_infer.cli", "bench", "--json", "-m", cfg.model, "-t", str(cfg.threads),
           "-p", str(cfg.n_prompt), "-n", str(cfg.n_gen), "-r", str(cfg.repetitions)]
    if not cfg.llama_cpp:
        cmd.append("--no-llama-cpp")
    if cfg.ik_llama_bench:
        cmd += ["--ik-llama-bench", cfg.ik_llama_bench]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgeInferError(f"benchmarking {cfg.model} failed: {last}")
    return json.loads(p.stdout)


def _cmd_workload(args: argparse.Namespace, threads: int) -> int:
    from edge_infer import hub
    from edge_infer.bench.serving import run_engine
    from edge_infer.bench.workloads import WORKLOADS, make_workload
    from edge_infer.config import EngineConfig
    from edge_infer.engine.engine import LLMEngine

    if len(args.model) != 1:
        raise InvalidRequest("--workload measures one model: give one -m")
    if args.workload not in WORKLOADS:
        raise InvalidRequest(f"unknown workload {args.workload!r} (known: {', '.join(WORKLOADS)})")
    try:
        concs = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise InvalidRequest(f"--concurrency must be a comma-separated list of integers, got {args.concurrency!r}") from None
    if not concs or min(concs) < 1 or args.requests < 1 or args.scale <= 0:
        raise InvalidRequest("--concurrency values and --requests must be at least 1, --scale positive")
    engine = LLMEngine(EngineConfig(model=str(hub.resolve_model(args.model[0])), n_threads=threads,
                                    max_num_seqs=max(concs), kv_cache_memory=2 * 2**30))
    reqs = make_workload(args.workload, args.requests, engine.model_config.vocab_size, scale=args.scale)
    rows = {f"concurrency {c}": run_engine(engine, reqs, c, static=False) for c in concs}
    if args.plot is not None:
        from edge_infer.bench.plot import plot_throughput

        plot_throughput({"edge-infer": {c: rows[f"concurrency {c}"]["tokens_per_s"] for c in concs}}, {}, args.plot,
                        f"{args.model[0]}, {args.workload}, {args.requests} requests, {threads} threads")
    if args.json:
        print(json.dumps({"model": args.model[0], "workload": args.workload, "requests": args.requests,
                          "scale": args.scale, "threads": threads, "rows": rows}, indent=2))
        return 0
    print(f"{args.model[0]}, workload {args.workload}: {args.requests} requests, scale {args.scale}, {threads} threads")
    print(f"{'':16}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>10}{'ITL p99':>10}")
    for k, r in rows.items():
        print(f"{k:16}{r['tokens_per_s']:>9.1f}{r['ttft_p50_s']:>9.2f}s{r['ttft_p99_s']:>9.2f}s"
              f"{r['itl_p50_s'] * 1000:>8.0f}ms{r['itl_p99_s'] * 1000:>8.0f}ms")
    return 0
