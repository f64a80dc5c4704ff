"""The second of two models in one process, after the first was dropped without close(),
against the same model alone in a fresh process: decode tokens/s (same run, alternating).

    python benchmarks/bench_lifecycle.py [--first smollm2-135m] [--second gemma3-270m] [--runs 3] [--json]

Before LLMs had a finalizer the dropped one kept its engine thread, weights and KV pool, and
the second decoded at 45 tok/s against 67 alone (gemma3 after smollm2).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys


def decode_tps(model: str, n: int = 64) -> float:
    from edge_infer import LLM, SamplingParams

    with LLM(model, n_threads=2, kv_cache_memory="64MiB") as llm:
        llm.generate(["Hi"], SamplingParams(max_tokens=4, temperature=0.0))
        out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=n + 1, temperature=0.0, ignore_eos=True))
        m = out[0].metrics
        assert m is not None
        return n / (m.token_times[-1] - m.token_times[0])


def after_dropped(first: str, second: str) -> float:
    from edge_infer import LLM, SamplingParams

    dropped = LLM(first, n_threads=2, kv_cache_memory="64MiB")
    dropped.generate(["Hello"], SamplingParams(max_tokens=8))
    del dropped  # no close(): the finalizer must release it
    gc.collect()
    return decode_tps(second)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", default="smollm2-135m")
    ap.add_argument("--second", default="gemma3-270m")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=("alone", "after"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(decode_tps(a.second) if a.child == "alone" else after_dropped(a.first, a.second))
        return 0
    res: dict[str, list[float]] = {"alone": [], "after": []}
    for _ in range(a.runs):
        for kind in ("alone", "after"):  # alternating, each in a fresh process
            p = subprocess.run([sys.executable, __file__, "--child", kind, "--first", a.first, "--second", a.second],
                               capture_output=True, text=True, check=True)
            res[kind].append(float(p.stdout.strip().splitlines()[-1]))
    alone, after = statistics.median(res["alone"]), statistics.median(res["after"])
    out = {"second": a.second, "first_dropped": a.first, "alone_tps": alone, "after_tps": after, "ratio": after / alone,
           "runs": res}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{a.second} decode, tok/s (medians of {a.runs})\nalone {alone:8.1f}\nafter a dropped {a.first} "
              f"{after:8.1f}\nratio {after / alone:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
