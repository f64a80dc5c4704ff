"""Mixture-of-experts speed against llama.cpp on the same file, same run: pp512 and decode at
batch 1 (`edge-infer bench`'s measurement, llama.cpp before and after ours) and decode of 16
concurrent streams (llama.cpp's batched decode, one token per stream per step, before and after).

    python benchmarks/bench_moe.py [--path FILE.gguf] [--threads 2] [--n-prompt 512] [--n-gen 64]
        [--streams 16] [--stream-prompt 32] [--reps 3] [--json]

The file is benchmarks/moe_file.py's random Q4_K qwen3moe (24 layers, width 1024, 32 experts of
width 512, 4 used, GQA 16/4 heads of 64), written on first use. Ratios are edge-infer / llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from moe_file import DEFAULT_PATH, write_moe_file

from edge_infer.bench.baseline import baseline_info, format_baseline
from edge_infer.bench.pp_tg import BenchConfig, bench_prompt, format_table, run


def llama_cpp_streams(path: str, prompts: list[list[int]], n_gen: int, threads: int) -> dict[str, Any]:
    for extra in ("1", "0"):  # repacked weights first; its AMX path can crash: fall back (and say so)
        p = subprocess.run([sys.executable, str(Path(__file__).with_name("llama_cpp_streams.py")), path, str(threads),
                            extra, str(n_gen)], input=json.dumps(prompts), capture_output=True, text=True, timeout=3600)
        if p.returncode == 0 and p.stdout.strip():
            return dict(json.loads(p.stdout.strip().splitlines()[-1]))
    return {"error": f"llama.cpp exited with code {p.returncode}: {p.stderr[-300:]}"}


def edge_streams(path: str, prompts: list[list[int]], n_gen: int, threads: int) -> dict[str, Any]:
    """All streams' prompts in one step, then decode tokens/s over the window in which every
    stream is decoding (after the last first token, before the first finish)."""
    from edge_infer import LLM, SamplingParams

    total = sum(len(p) for p in prompts)
    with LLM(path, n_threads=threads, max_num_seqs=len(prompts), max_num_batched_tokens=max(total, 256),
             enable_prefix_caching=False, kv_cache_memory=256 * 2**20) as llm:
        llm.generate([prompts[0][:8]], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        outs = llm.generate(prompts, SamplingParams(max_tokens=n_gen + 1, temperature=0.0, ignore_eos=True))
    times = [o.metrics.token_times for o in outs if o.metrics is not None]
    start, end = max(t[0] for t in times), min(t[-1] for t in times)
    tokens = sum(sum(1 for x in t if start < x <= end) for t in times)
    return {"streams": len(prompts), "decode_tps": tokens / (end - start), "wall_s": end - start}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", type=Path, default=DEFAULT_PATH)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--stream-prompt", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not a.path.exists():
        print(f"writing {a.path} ...", file=sys.stderr)
        write_moe_file(a.path)
    path = str(a.path)
    single = run(BenchConfig(path, a.threads, a.n_prompt, a.n_gen, a.reps))
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.models import config_from_gguf

    with GGUFFile(path) as f:
        vocab = config_from_gguf(f).vocab_size
    prompts = [bench_prompt(vocab, a.stream_prompt, 100 + s) for s in range(a.streams)]
    before = llama_cpp_streams(path, prompts, a.n_gen, a.threads)
    ours = edge_streams(path, prompts, a.n_gen, a.threads)
    after = llama_cpp_streams(path, prompts, a.n_gen, a.threads)
    streams: dict[str, Any] = {"edge": ours, "llama_cpp_before": before, "llama_cpp_after": after}
    if "decode_tps" in before and "decode_tps" in after:
        ref = (before["decode_tps"] + after["decode_tps"]) / 2
        streams["llama_cpp_tps"] = ref
        streams["ratio"] = ours["decode_tps"] / ref
    res = {"single": single, "streams": streams, "llama_cpp_build": baseline_info()}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(format_table(single))
    print(f"\ndecode, {a.streams} concurrent streams ({a.stream_prompt}-token prompts, {a.n_gen} steps), tok/s")
    print(f"{'edge-infer':14}{ours['decode_tps']:>10.1f}")
    for name, r in (("llama.cpp", before), ("  after us", after)):
        print(f"{name:14}{r['decode_tps']:>10.1f}" if "decode_tps" in r else f"{name:14} {r.get('error')}")
    if "ratio" in streams:
        print(f"{'ratio':14}{streams['ratio']:>9.2f}x (against the mean of llama.cpp's two runs)")
    print(format_baseline(res["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
