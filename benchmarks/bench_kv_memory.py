"""KV memory on small boxes: llama.cpp's quantized KV types and the prefix cache on disk.

    python benchmarks/bench_kv_memory.py [-m MODEL] [--threads 2] [--context 4096] [--n-gen 64]
        [--types f16,q8_0,q4_0] [--disk-prompt 1500] [--reps 3] [--no-llama-cpp] [--json]

(a) Decode at a long context: a --context-token prompt, then --n-gen greedy tokens; decode
    tok/s and the KV pool's bytes per token and size for that context, per KV type, in the same
    run (ours; llama.cpp's llama-bench-style greedy decode with the same type_k / type_v and
    flash attention on, in a child process, beside it unless --no-llama-cpp).
(b) The disk prefix cache: a fresh process runs a --disk-prompt-token prompt (cold: nothing on
    disk, then it exits and saves its blocks); another fresh process runs the same prompt
    (warm: its blocks load from disk). Time to first token of each (median of --reps pairs),
    and whether the greedy tokens are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from edge_infer.bench.baseline import baseline_info, format_baseline
from edge_infer.bench.pp_tg import bench_prompt

CHILD = """
import json, sys, time
from edge_infer import LLM, SamplingParams
path, cache, threads, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from edge_infer.bench.pp_tg import bench_prompt
with LLM(path, n_threads=threads, prefix_cache_dir=cache, kv_cache_memory="512MiB", max_num_batched_tokens=512) as llm:
    ids = bench_prompt(llm.model_config.vocab_size, n, 7)
    out = llm.generate([ids], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))[0]
    m = out.metrics
    hits = llm.metrics().get("disk_hits", 0)
print(json.dumps({"ttft": m.first_token_time - m.arrival_time, "tokens": list(out.outputs[0].token_ids),
                  "hits": hits}))
"""


def decode_at_context(path: str, kv: str, threads: int, context: int, n_gen: int, reps: int) -> dict[str, Any]:
    from edge_infer import LLM, SamplingParams

    with LLM(path, n_threads=threads, kv_cache_dtype=kv, max_model_len=context + n_gen + 16,
             kv_cache_memory=2**31, max_num_batched_tokens=512, max_num_seqs=1, enable_prefix_caching=False) as llm:
        prompt = bench_prompt(llm.model_config.vocab_size, context, 11)
        tg = []
        for _ in range(reps):
            out = llm.generate([prompt], SamplingParams(max_tokens=n_gen + 1, temperature=0.0, ignore_eos=True))[0]
            times = out.metrics.token_times  # type: ignore[union-attr]
            tg.append(n_gen / (times[-1] - times[0]))
        per_token = llm.plan.kv_bytes_per_token
    return {"kv": kv, "tg_tps": statistics.median(tg), "bytes_per_token": per_token,
            "pool_mib_at_context": per_token * (context + n_gen) / 2**20}


def llama_cpp_decode(path: str, kv: str, threads: int, context: int, n_gen: int) -> float | None:
    """llama.cpp's greedy decode tok/s after a --context prompt with the same KV types, in a
    child process (as edge-infer bench runs it: its OpenMP threads, still spinning after its
    decode, would otherwise take the cores from our next measurement); None without llama-cpp-python."""
    r = subprocess.run([sys.executable, __file__, "--llama-cpp-child", path, kv, str(threads), str(context), str(n_gen)],
                       capture_output=True, text=True, timeout=3600, env={**os.environ, "NUMBA_NUM_THREADS": str(threads)})
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp's decode failed: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return None if out is None else float(out)


def _llama_cpp_decode_here(path: str, kv: str, threads: int, context: int, n_gen: int) -> float | None:
    try:
        from edge_infer.bench.llamacpp import LlamaCppGreedy
    except ImportError:
        return None
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.models import config_from_gguf

    with GGUFFile(path) as f:
        vocab = config_from_gguf(f).vocab_size
    ll = LlamaCppGreedy(path, threads, context + n_gen + 16, 512, True, (kv, kv))
    try:
        prompt = bench_prompt(vocab, context, 11)
        tok = 0
        for i in range(0, context, 512):
            tok = ll.decode(prompt[i : i + 512], i)
        t0 = time.perf_counter()
        for i in range(n_gen):
            tok = ll.decode([tok], context + i)
        return n_gen / (time.perf_counter() - t0)
    finally:
        ll.close()


def disk_ttft(path: str, threads: int, n: int, reps: int) -> dict[str, Any]:
    cold, warm, same = [], [], True
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as cache:
            runs = []
            for _ in range(2):
                r = subprocess.run([sys.executable, "-c", CHILD, path, cache, str(threads), str(n)], capture_output=True,
                                   text=True, check=True, env={**os.environ, "NUMBA_NUM_THREADS": str(threads)})
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        cold.append(runs[0]["ttft"])
        warm.append(runs[1]["ttft"])
        same &= runs[0]["tokens"] == runs[1]["tokens"] and runs[1]["hits"] > 0
    c, w = statistics.median(cold), statistics.median(warm)
    return {"prompt_tokens": n, "cold_ttft_s": c, "warm_ttft_s": w, "speedup": c / w, "identical_tokens": same}


def main() -> int:
    from edge_infer import hub

    if len(sys.argv) == 7 and sys.argv[1] == "--llama-cpp-child":  # llama_cpp_decode's child process
        path, kv, threads, context, n_gen = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:])
        print(json.dumps(_llama_cpp_decode_here(path, kv, threads, context, n_gen)))
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--n-gen", type=int, default=64)
    p.add_argument("--types", default="f16,q8_0,q4_0")
    p.add_argument("--disk-prompt", type=int, default=1500, help="0: no disk prefix cache part")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    path = str(hub.resolve_model(a.model))
    rows = []
    for kv in a.types.split(","):
        row = decode_at_context(path, kv, a.threads, a.context, a.n_gen, a.reps)
        if not a.no_llama_cpp:
            row["llama_cpp_tg_tps"] = llama_cpp_decode(path, kv, a.threads, a.context, a.n_gen)
        rows.append(row)
    disk = disk_ttft(path, a.threads, a.disk_prompt, a.reps) if a.disk_prompt > 0 else None
    res = {"model": a.model, "threads": a.threads, "context": a.context, "decode": rows, "disk": disk,
           "llama_cpp_build": None if a.no_llama_cpp else baseline_info()}
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"model {a.model}, {a.threads} threads; decode after a {a.context}-token prompt (median of {a.reps})")
    print(f"{'KV':10}{'bytes/token':>13}{'pool MiB':>10}{'tg tok/s':>10}{'llama.cpp':>11}")
    for r in rows:
        ref = r.get("llama_cpp_tg_tps")
        print(f"{r['kv']:10}{r['bytes_per_token']:>13}{r['pool_mib_at_context']:>10.1f}{r['tg_tps']:>10.2f}"
              f"{(f'{ref:.2f}' if ref else '-'):>11}")
    if disk is not None:
        print(f"disk prefix cache, {disk['prompt_tokens']}-token prompt, fresh processes: TTFT cold "
              f"{disk['cold_ttft_s']:.3f}s, warm {disk['warm_ttft_s']:.3f}s ({disk['speedup']:.1f}x), identical greedy "
              f"tokens: {disk['identical_tokens']}")
    if res["llama_cpp_build"]:
        print(format_baseline(res["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
