"""Speculative decoding: acceptance and decode speed-up over plain decoding in the same run, and
llama.cpp's prompt-lookup decoding (llama-cpp-python) on the same prompt.

    python benchmarks/bench_spec.py [--ngram-model qwen2.5-coder-0.5b] [--draft-target PATH_F16]
        [--k 8] [--max-tokens 128] [--threads 2] [--task FILE] [--json]

- n-gram: an input-grounded task (reproduce a given function with a small change), greedy, at
  concurrency 1: plain vs prompt lookup. --task FILE: another user message instead (a held-out
  check: the speed-up on a task the defaults were not tuned on).
- draft model: the target is an F16 copy of smollm2-135m (made with make_f16_copy.py if
  --draft-target is not given), the draft the original Q4_1 file: plain F16 vs draft-assisted.
Speeds are decode tokens/s (first to last generated token); outputs are checked identical.
llama.cpp runs before and after edge-infer; its figures are the mean of both runs (each kept in --json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from edge_infer import LLM, SamplingParams, hub  # noqa: E402
from edge_infer.bench.baseline import baseline_info, combine_runs, format_baseline  # noqa: E402

CODE_TASK = '''Here is a Python function:

```python
def moving_average(values, window):
    """Return the moving averages of `values` over `window` items."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
```

Rewrite it exactly as it is, but rename the function to rolling_mean. Output only the code.'''
# chatml, qwen2.5-coder's template; also the task of tests/engine/test_spec_real.py
CODE_PROMPT = f"<|im_start|>user\n{CODE_TASK}<|im_end|>\n<|im_start|>assistant\n"


def decode_tps(out) -> float:  # type: ignore[no-untyped-def]
    t = out.metrics.token_times
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 else 0.0


def run_pair(model: str, prompt: str | list[int], spec: dict, threads: int, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    res = {}
    for name, sp in (("plain", None), ("spec", spec)):
        with LLM(model, n_threads=threads, kv_cache_memory=512 * 2**20, speculative=sp) as llm:
            llm.generate([prompt if isinstance(prompt, list) else prompt[:64]], SamplingParams(max_tokens=2))
            out = llm.generate([prompt], params)[0]
            res[name] = {"decode_tps": decode_tps(out), "tokens": len(out.token_ids), "ids": out.token_ids}
            if sp:
                m = llm.metrics()
                res[name].update(acceptance=m.get("spec_acceptance_rate", 0.0),
                                 tokens_per_step=m.get("spec_tokens_per_step", 0.0))
    res["identical"] = res["plain"]["ids"] == res["spec"]["ids"]
    res["speedup"] = res["spec"]["decode_tps"] / res["plain"]["decode_tps"]
    for name in ("plain", "spec"):
        del res[name]["ids"]
    return res


def llama_cpp_lookup(path: str, prompt: str, threads: int, max_tokens: int, k: int) -> dict | None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    for extra in ("1", "0"):
        p = subprocess.run([sys.executable, str(Path(__file__).with_name("llama_cpp_lookup.py")), path, str(threads),
                            str(max_tokens), str(k), extra], input=prompt, capture_output=True, text=True, timeout=3600)
        if p.returncode == 0 and p.stdout.strip():
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["speedup"] = r["lookup_tps"] / r["plain_tps"]
            return r
    return {"error": f"llama.cpp exited with code {p.returncode}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ngram-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft-target", default=None, help="F16 copy of smollm2 (made if missing)")
    ap.add_argument("--k", default="8", help="proposal length or 'auto'")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-draft", action="store_true")
    ap.add_argument("--task", default=None, help="a text file: the n-gram case's user message (default: CODE_TASK)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    k = args.k if args.k == "auto" else int(args.k)
    res: dict = {}
    ngram_path = str(hub.resolve_model(args.ngram_model))
    lc_k = k if isinstance(k, int) else 8
    prompt = CODE_PROMPT
    if args.task:
        try:
            task = Path(args.task).read_text(encoding="utf-8").strip()
        except OSError as e:
            sys.exit(f"bench_spec: cannot read --task {args.task}: {e.strerror or e}")
        if not task:
            sys.exit(f"bench_spec: --task {args.task} is empty")
        prompt = f"<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n"
    before = llama_cpp_lookup(ngram_path, prompt, args.threads, args.max_tokens, lc_k)
    res["ngram"] = run_pair(ngram_path, prompt, {"method": "ngram", "k": k}, args.threads, args.max_tokens)
    after = llama_cpp_lookup(ngram_path, prompt, args.threads, args.max_tokens, lc_k) if before else None
    ref = combine_runs(before, after, ("lookup_tps", "plain_tps"))
    if ref is not None:
        if "before" in ref:
            ref["speedup"] = ref["lookup_tps"] / ref["plain_tps"]
        res["ngram"]["llama_cpp"] = ref
        res["llama_cpp_build"] = baseline_info()
    if not args.skip_draft:
        draft = str(hub.resolve_model("smollm2-135m"))
        target = args.draft_target or str(hub.cache_dir() / "models" / "smollm2-135m-f16.gguf")
        if not Path(target).exists():
            from make_f16_copy import write_copy

            write_copy(draft, target)
        prompt = "Write a short story about a robot who learns to paint. Once upon a time,"
        res["draft"] = run_pair(target, prompt, {"method": "draft", "model": draft, "k": k}, args.threads,
                                args.max_tokens)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    for name, r in res.items():
        if name == "llama_cpp_build":
            print(format_baseline(r))
            continue
        print(f"{name}: plain {r['plain']['decode_tps']:.1f} tok/s, speculative {r['spec']['decode_tps']:.1f} tok/s "
              f"-> {r['speedup']:.2f}x  (acceptance {r['spec']['acceptance']:.0%}, "
              f"{r['spec']['tokens_per_step']:.2f} tokens/step, identical output: {r['identical']})")
        lc = r.get("llama_cpp")
        if lc and "speedup" in lc:
            print(f"  llama.cpp prompt lookup: plain {lc['plain_tps']:.1f} tok/s, lookup {lc['lookup_tps']:.1f} tok/s "
                  f"-> {lc['speedup']:.2f}x (end-to-end, prompt included; mean of the runs before and after ours)")
        elif lc:
            print(f"  llama.cpp: {lc['error']}")


if __name__ == "__main__":
    main()
