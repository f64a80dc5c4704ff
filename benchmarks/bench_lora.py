"""LoRA adapters: decode speed with adapters against the base, ours and llama.cpp's, same run.

    python benchmarks/bench_lora.py [--model qwen2.5-coder-0.5b] [--rank 16] [--threads 2]
                                    [--tokens 64] [--streams 16] [--adapters 4] [--reps 3] [--json]

Random rank-R adapters (tests/support/lora_files.py: F16 tensors on every attention and MLP
matrix, as PEFT's all-linear LoRA) for the model. Rows, medians of --reps:
- one stream: decode tokens/s of the base, and with one adapter (the issue's target: at most 15%
  slower); llama.cpp the same two (its --lora), for reference;
- --streams streams: the base on all of them, then --adapters adapters spread over them (the
  issue's target: at least 0.8x the base's tokens/s).
Greedy, ignore_eos, short distinct prompts; decode tokens/s counts tokens after the first over
the time from the first token to the last.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "List three colors:",
           "Water boils at", "My favourite book is", "In 1969, astronauts", "The best way to learn",
           "Rust and Python differ", "A haiku about rain:", "SELECT name FROM", "The mitochondria is",
           "Dear hiring manager,", "import numpy as np", "The recipe needs", "Chess openings such as"]


def _decode_tps(outs: list[Any]) -> float:
    first = min(o.metrics.first_token_time for o in outs)
    last = max(o.metrics.last_token_time for o in outs)
    return sum(len(o.token_ids) - 1 for o in outs) / max(last - first, 1e-9)


def ours(model: Path, adapters: list[Path], args: argparse.Namespace) -> tuple[dict[str, float], list[int]]:
    from edge_infer import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    names = [f"a{i}" for i in range(len(adapters))]
    rows: dict[str, list[float]] = {"base_1": [], "lora_1": [], "base_n": [], "lora_n": []}
    with LLM(str(model), n_threads=args.threads, kv_cache_memory="512MiB", max_num_seqs=max(args.streams, 1),
             adapters={n: str(p) for n, p in zip(names, adapters)}) as llm:
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=4), adapter=names[0])  # compile and warm
        for _ in range(args.reps):
            rows["base_1"].append(_decode_tps(llm.generate(PROMPTS[0], params)))
            rows["lora_1"].append(_decode_tps(llm.generate(PROMPTS[0], params, adapter=names[0])))
            prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(args.streams)]
            rows["base_n"].append(_decode_tps(llm.generate(prompts, params)))
            handles = [llm.worker.submit(p, params, lora=((names[i % len(names)], None),)) for i, p in enumerate(prompts)]
            rows["lora_n"].append(_decode_tps([llm._wait(h) for h in handles]))
        prompt = llm.tokenizer.encode(PROMPTS[0], add_special=True)
    return {k: statistics.median(v) for k, v in rows.items()}, prompt


def llama_cpp(model: Path, adapter: Path, prompt: list[int], args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        import llama_cpp as lc  # noqa: F401
    except ImportError:
        return None
    from edge_infer.bench.baseline import baseline_info, format_baseline
    from edge_infer.bench.llamacpp import LlamaCppGreedy

    ll = LlamaCppGreedy(str(model), args.threads, 512, 64, True)
    ad = ll.lc.llama_adapter_lora_init(ll.model, str(adapter).encode())

    def run(with_adapter: bool) -> float:
        arr = (ll.lc.llama_adapter_lora_p_ctypes * 1)(ad)
        scales = (ctypes.c_float * 1)(1.0)
        ll.lc.llama_set_adapters_lora(ll.ctx, arr if with_adapter else None, 1 if with_adapter else 0,
                                      scales if with_adapter else None)
        ll.clear()
        tok = ll.decode(prompt, 0)
        t0 = time.perf_counter()
        for i in range(args.tokens - 1):
            tok = ll.decode([tok], len(prompt) + i)
        return (args.tokens - 1) / (time.perf_counter() - t0)

    run(True)
    base = statistics.median(run(False) for _ in range(args.reps))
    lora = statistics.median(run(True) for _ in range(args.reps))
    ll.lc.llama_adapter_lora_free(ad)
    ll.close()
    return {"base_1": base, "lora_1": lora, "baseline": format_baseline(baseline_info())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from lora_files import write_lora

    from edge_infer.hub import resolve_model

    model = Path(resolve_model(args.model)) if not args.model.endswith(".gguf") else Path(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = [write_lora(Path(tmp) / f"a{i}.gguf", model, rank=args.rank, strength=0.03, seed=i, dtype="F16")
                    for i in range(args.adapters)]
        ours_r, prompt = ours(model, adapters, args)
        ref = llama_cpp(model, adapters[0], prompt, args)
    result = {"model": model.name, "rank": args.rank, "threads": args.threads, "streams": args.streams,
              "adapters": args.adapters, "ours": ours_r, "llama_cpp": ref,
              "single_stream_overhead": 1.0 - ours_r["lora_1"] / ours_r["base_1"],
              "multi_adapter_vs_base": ours_r["lora_n"] / ours_r["base_n"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{model.name}, rank-{args.rank} F16 adapters on every attention and MLP matrix, {args.threads} threads, "
          f"{args.tokens} tokens")
    print(f"{'row':44s} {'ours tok/s':>11s} {'llama.cpp':>11s}")
    print(f"{'1 stream, base':44s} {ours_r['base_1']:11.1f} {ref['base_1'] if ref else float('nan'):11.1f}")
    print(f"{'1 stream, one adapter':44s} {ours_r['lora_1']:11.1f} {ref['lora_1'] if ref else float('nan'):11.1f}")
    print(f"{f'{args.streams} streams, base':44s} {ours_r['base_n']:11.1f}")
    print(f"{f'{args.streams} streams over {args.adapters} adapters':44s} {ours_r['lora_n']:11.1f}")
    print(f"single-stream overhead of the adapter: {100 * result['single_stream_overhead']:.1f}% (target <= 15%)")
    print(f"{args.adapters} adapters vs base at {args.streams} streams: {result['multi_adapter_vs_base']:.2f}x "
          "(target >= 0.8x)")
    if ref:
        print(f"llama.cpp's own adapter overhead: {100 * (1 - ref['lora_1'] / ref['base_1']):.1f}%")
        print(ref["baseline"])


if __name__ == "__main__":
    main()
