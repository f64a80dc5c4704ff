"""A hybrid recurrent model's speed against llama.cpp on the same file, same run, and what the
state snapshots buy a prefix-cache hit:

    python benchmarks/bench_hybrid.py [--shape lfm2-1.2b|qwen35-0.8b] [--path FILE.gguf] [--threads 2]
        [--n-prompt 512] [--n-gen 64] [--prefix 2000] [--reps 3] [--json]

The file is benchmarks/hybrid_file.py's random Q4_K file of the shape, written on first use.
pp and decode at batch 1 are `edge-infer bench`'s measurement (llama.cpp before and after
ours; ratios edge-infer / llama.cpp). Time to first token of a prompt of `--prefix` tokens plus
16: cold (a fresh prefix), then the same prefix with another 16-token suffix, which resumes
from the state snapshot at the last cached block before the suffix (median of --reps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from hybrid_file import SHAPES, default_path, write_hybrid_file

from edge_infer.bench.baseline import baseline_info, format_baseline
from edge_infer.bench.pp_tg import BenchConfig, bench_prompt, format_table, run


def prefix_ttft(path: str, threads: int, prefix: int, reps: int) -> dict[str, Any]:
    from edge_infer import LLM, SamplingParams
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.models import config_from_gguf

    with GGUFFile(path) as f:
        vocab = config_from_gguf(f).vocab_size
    one = SamplingParams(max_tokens=1, temperature=0.0)
    cold: list[float] = []
    hit: list[float] = []
    with LLM(path, n_threads=threads, kv_cache_memory=2**30, max_num_batched_tokens=512, max_num_seqs=4) as llm:
        llm.generate([bench_prompt(vocab, 8, 0)], one)  # warm-up
        for r in range(reps):
            shared = bench_prompt(vocab, prefix, 1000 + r)  # a new prefix each repetition: cold
            for times, seed in ((cold, 1), (hit, 2)):
                out = llm.generate([shared + bench_prompt(vocab, 16, seed)], one)[0]
                assert out.metrics is not None and out.metrics.first_token_time is not None
                times.append(out.metrics.first_token_time - out.metrics.arrival_time)
        snapshots = llm.metrics().get("state_snapshots", 0.0)
    c, h = statistics.median(cold), statistics.median(hit)
    return {"prefix": prefix, "cold_ttft_s": c, "hit_ttft_s": h, "speedup": c / h, "state_snapshots": snapshots}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="lfm2-1.2b")
    ap.add_argument("--path", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    file = a.path or default_path(a.shape)
    if not file.exists():
        print(f"writing {file} ...", file=sys.stderr)
        write_hybrid_file(file, shape=a.shape)
    path = str(file)
    single = run(BenchConfig(path, a.threads, a.n_prompt, a.n_gen, a.reps))
    ttft = prefix_ttft(path, a.threads, a.prefix, a.reps)
    res = {"single": single, "prefix_hit": ttft, "llama_cpp_build": baseline_info()}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(format_table(single))
    print(f"\ntime to first token, {a.prefix}-token prefix + 16 (medians of {a.reps})")
    print(f"{'cold':14}{ttft['cold_ttft_s'] * 1000:>10.0f} ms")
    print(f"{'prefix hit':14}{ttft['hit_ttft_s'] * 1000:>10.0f} ms   ({ttft['speedup']:.1f}x faster)")
    print(format_baseline(res["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
