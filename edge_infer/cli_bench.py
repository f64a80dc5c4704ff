"""`edge-infer bench`: prefill and decode speed, side by side with llama.cpp in the same run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from edge_infer.errors import InvalidRequest
from edge_infer.hub import DEFAULT_MODEL


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", parents=parents, help="prefill/decode tokens/s, with llama.cpp side by side",
        description="Measure prefill (ppN: an N-token prompt) and decode (tgN: N greedy tokens after it) "
        "tokens/s; with llama-cpp-python installed, llama.cpp on the same model, prompt and threads in "
        "the same run. Figures are medians of --repetitions runs.",
    )  # fmt: skip
    p.add_argument("-m", "--model", default=DEFAULT_MODEL, help=f"known name or .gguf path (default {DEFAULT_MODEL})")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: physical cores)")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens (default 128)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions (default 3)")
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp side")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from edge_infer.bench import BenchConfig, format_table, run
    from edge_infer.config import default_threads

    for name in ("n_prompt", "n_gen", "repetitions"):
        if getattr(args, name) < 1:
            raise InvalidRequest(f"--{name.replace('_', '-')} must be at least 1")
    threads = args.threads or default_threads()
    if threads < 1:
        raise InvalidRequest("--threads must be at least 1")
    res = run(BenchConfig(args.model, threads, args.n_prompt, args.n_gen, args.repetitions, not args.no_llama_cpp))
    print(json.dumps(res, indent=2) if args.json else format_table(res))
    return 0
