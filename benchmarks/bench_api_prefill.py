"""Prefill as each public path delivers it, beside llama.cpp's, in one run: where a 512-token
prompt's time to first token goes between `edge-infer bench`'s figure and a client of the server.

    python benchmarks/bench_api_prefill.py [-m MODEL] [-t 2] [-p 512] [-r 3] [--no-llama-cpp] [--json]

Rows (tokens of prompt per second of time to the first token; medians of -r runs, each on a
prompt no earlier run shares a block with, so the prefix cache never serves one):
- `bench`: `edge-infer bench`'s own measure: one forward of the whole prompt
  (max_num_batched_tokens = the prompt), from the step that first schedules it to its token.
- `LLM (defaults)`: `LLM(model, n_threads=t)` as a script makes it (chunked prefill, the
  default step budget), wall time of `generate(max_tokens=1)`.
- `server, token ids` / `server, text`: `edge-infer serve -m MODEL -t t` with its defaults, a
  streamed /v1/completions, wall time from the request to its first `data:` chunk as the client
  sees it (the text prompt is tokenized by the server; its rate counts usage.prompt_tokens).
- llama.cpp: its pp through the low-level decode API in a child process (as `edge-infer
  bench`), before and after ours, with its build's system info printed beside it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from bench_server import stop, wait_http  # noqa: E402
from ports import free_port  # noqa: E402

from edge_infer import hub  # noqa: E402
from edge_infer.bench.baseline import baseline_info, format_baseline  # noqa: E402
from edge_infer.bench.pp_tg import BenchConfig, bench_prompt, combine_baseline, run_llama_cpp  # noqa: E402


def fresh(prompt: list[int], rng: random.Random) -> list[int]:
    """The prompt with new first tokens: no block of it is in any cache."""
    return [rng.randrange(1000, 20000) for _ in range(4)] + prompt[4:]


def bench_rows(path: str, prompt: list[int], threads: int, reps: int, rng: random.Random) -> dict[str, list[float]]:
    from edge_infer.llm import LLM
    from edge_infer.sampling_params import SamplingParams

    n, rows = len(prompt), {}
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    # edge-infer bench's configuration and measure
    with LLM(path, n_threads=threads, max_num_batched_tokens=max(n, 256), enable_prefix_caching=False,
             kv_cache_memory=256 * 2**20, max_num_seqs=1, max_model_len=n + 64) as llm:
        llm.generate([prompt[:16]], SamplingParams(max_tokens=4, temperature=0.0))
        got = []
        for _ in range(reps):
            m = llm.generate([fresh(prompt, rng)], one)[0].metrics
            assert m is not None and m.first_token_time is not None and m.first_scheduled_time is not None
            got.append(n / (m.first_token_time - m.first_scheduled_time))
        rows["bench"] = got
    with LLM(path, n_threads=threads) as llm:
        llm.generate([prompt[:16]], SamplingParams(max_tokens=4, temperature=0.0))
        got = []
        for _ in range(reps):
            t0 = time.perf_counter()
            llm.generate([fresh(prompt, rng)], one)
            got.append(n / (time.perf_counter() - t0))
        rows["LLM (defaults)"] = got
    return rows


def first_chunk_rate(client: httpx.Client, url: str, prompt: Any, n: int | None) -> float:
    """Prompt tokens per second of the time to the first streamed chunk (n: the prompt's tokens;
    None: read from the final chunk's usage)."""
    body = {"prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    t0, ttft, usage = time.perf_counter(), None, None
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
    assert ttft is not None and (n is not None or usage is not None)
    return (n if n is not None else usage["prompt_tokens"]) / ttft


def server_rows(path: str, prompt: list[int], threads: int, reps: int, rng: random.Random) -> dict[str, list[float]]:
    port = free_port()
    log = open(Path("/tmp") / f"bench_api_prefill_{port}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "edge_infer.cli", "serve", "-m", path, "--port", str(port),
                             "-t", str(threads)], stdout=log, stderr=subprocess.STDOUT)
    url, rows = f"http://127.0.0.1:{port}", {}
    try:
        if not wait_http(proc, url + "/health", 600):
            raise SystemExit(f"edge-infer serve did not become ready (log: {log.name})")
        with httpx.Client(timeout=600) as client:
            client.post(url + "/v1/completions", json={"prompt": prompt[:16], "max_tokens": 2})
            rows["server, token ids"] = [first_chunk_rate(client, url, fresh(prompt, rng), len(prompt))
                                         for _ in range(reps)]
            texts = [_text(url, client, fresh(prompt, rng)) for _ in range(reps)]
            rows["server, text"] = [first_chunk_rate(client, url, t, None) for t in texts]
    finally:
        stop(proc)
        log.close()
    return rows


def _text(url: str, client: httpx.Client, ids: list[int]) -> str:
    """The prompt's ids as text (through the server's /detokenize, which every model has)."""
    r = client.post(url + "/detokenize", json={"tokens": ids})
    r.raise_for_status()
    return str(r.json()["prompt"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.models import config_from_gguf

    path = str(hub.resolve_model(args.model))
    with GGUFFile(path) as f:
        vocab = config_from_gguf(f).vocab_size
    prompt, rng = bench_prompt(vocab, args.n_prompt, args.seed), random.Random(args.seed)
    cfg = BenchConfig(path, threads=args.threads, n_prompt=args.n_prompt, n_gen=2, repetitions=args.repetitions)
    before = None if args.no_llama_cpp else run_llama_cpp(cfg, path, vocab)
    rows = bench_rows(path, prompt, args.threads, args.repetitions, rng)
    rows.update(server_rows(path, prompt, args.threads, args.repetitions, rng))
    after = run_llama_cpp(cfg, path, vocab) if before is not None and "pp_tps" in before else None
    ref = combine_baseline(before, after)
    out: dict[str, Any] = {"model": args.model, "threads": args.threads, "n_prompt": args.n_prompt,
                           "rows": {k: {"tps": statistics.median(v), "all": v} for k, v in rows.items()}}
    if ref and "pp_tps" in ref:
        out["llama_cpp"] = ref
        out["llama_cpp_build"] = baseline_info()
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    base = out.get("llama_cpp", {}).get("pp_tps")
    print(f"{args.model}, {args.threads} threads, a {args.n_prompt}-token prompt: prompt tokens/s of the time to "
          "the first token")
    print(f"{'path':22}{'tok/s':>9}{'vs bench':>10}{'vs llama.cpp':>14}   runs")
    b = out["rows"]["bench"]["tps"]
    for k, v in out["rows"].items():
        vs = f"{v['tps'] / base:>13.2f}x" if base else f"{'':>14}"
        print(f"{k:22}{v['tps']:>9.1f}{v['tps'] / b:>9.2f}x{vs}   {', '.join(f'{x:.0f}' for x in v['all'])}")
    if base:
        r = out["llama_cpp"]
        print(f"{'llama.cpp pp':22}{base:>9.1f}   (before us {r['before']['pp_tps']:.1f}, after us "
              f"{r['after']['pp_tps']:.1f})" if "before" in r else f"{'llama.cpp pp':22}{base:>9.1f}")
        print(format_baseline(out["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
