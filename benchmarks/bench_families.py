"""A 2026 family's speed against llama.cpp on the same file, same run:

    python benchmarks/bench_families.py [--shape gemma3n-e2b|gpt-oss-20b-experts] [--path FILE.gguf]
        [--threads 2] [--n-prompt 512] [--n-gen 64] [--reps 3] [--json]

The file is benchmarks/families_file.py's random file of the shape (gemma3n-e2b: Gemma 3n E2B's
30 layers with AltUp, LAuReL, per-layer inputs and KV sharing, Q4_K; gpt-oss-20b-experts: 4 of
gpt-oss-20b's layers with its 32 MXFP4 experts), written on first use. pp and decode at batch 1
are `edge-infer bench`'s measurement (llama.cpp before and after ours; ratios edge-infer /
llama.cpp), with llama.cpp's build and system info.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from families_file import SHAPES, default_path, write_families_file

from edge_infer.bench.baseline import baseline_info, format_baseline
from edge_infer.bench.pp_tg import BenchConfig, format_table, run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default=SHAPES[0])
    ap.add_argument("--path", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    file = a.path or default_path(a.shape)
    if not file.exists():
        print(f"writing {file} ...", file=sys.stderr)
        write_families_file(file, a.shape)
    res = {"shape": a.shape, "single": run(BenchConfig(str(file), a.threads, a.n_prompt, a.n_gen, a.reps)),
           "llama_cpp_build": baseline_info()}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{a.shape} ({file})")
    print(format_table(res["single"]))
    print(format_baseline(res["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
