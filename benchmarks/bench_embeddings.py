"""Embeddings per second of an encoder against llama.cpp's embed() on the same file, same run:

    python benchmarks/bench_embeddings.py [--model all-minilm-l6-v2 | FILE.gguf] [--threads 2]
        [--batches 1,32] [--reps 5] [--json]

Inputs are 32 sentences of 6-25 words (a retrieval workload's passages are short). Batch 1:
each sentence embedded in its own call; batch B: calls of B sentences. llama.cpp
(llama-cpp-python's Llama(embedding=True).embed, the baseline build of
benchmarks/llama_cpp_build.py) runs in a child process before and after ours, so a machine that
drifts shows as two baselines; the best of `reps` timed passes each (after one warm-up pass).
Ratios are edge-infer / llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

SENTENCES = [
    "The capital of France is Paris.",
    "A cat sat quietly on the warm windowsill all afternoon.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "How do I reset my router to factory settings?",
    "The stock market fell sharply after the central bank raised interest rates again.",
    "Bananas are rich in potassium.",
    "She finished the marathon in under four hours despite the rain and the strong headwind.",
    "Quantum computers use qubits that can exist in superpositions of states.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "What time does the last train to the airport leave on Sundays?",
    "Mount Everest is the highest mountain above sea level.",
    "Regular exercise improves both physical health and mental well-being over time.",
    "The library will be closed for renovations until the end of next month.",
    "Python is a popular programming language for data science and machine learning.",
    "The committee postponed its decision on the new stadium because of budget concerns.",
    "Whales communicate with each other using complex songs that travel for miles.",
    "Please remember to bring your passport and a printed copy of the booking.",
    "The ancient city was buried under volcanic ash for almost two thousand years.",
    "Electric cars are becoming cheaper as battery prices continue to drop.",
    "He apologized for the misunderstanding and offered to pay for the damage.",
    "Honey never spoils if it is stored in a sealed container.",
    "The orchestra performed a new symphony written by a young local composer.",
    "Can you recommend a good book about the history of mathematics?",
    "Heavy snowfall closed several mountain passes and delayed deliveries across the region.",
    "Vaccines train the immune system to recognise specific pathogens.",
    "The startup raised twenty million dollars to expand into European markets.",
    "Tomatoes grow best in full sun with regular watering.",
    "The detective noticed a faint scratch on the window frame that everyone else had missed.",
    "Light travels at about three hundred thousand kilometres per second.",
    "Our team meeting has been moved from Tuesday morning to Thursday afternoon.",
    "Coral reefs are threatened by warming oceans and pollution.",
    "The museum's new exhibition explores how maps shaped the way people saw the world.",
]


def _batches(b: int) -> list[list[str]]:
    return [SENTENCES[i : i + b] for i in range(0, len(SENTENCES), b)]


def _time(embed: Any, b: int, reps: int) -> float:
    """Embeddings per second, best of reps passes over the sentences in calls of b."""
    calls = _batches(b)
    for c in calls:  # warm-up pass
        embed(c)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for c in calls:
            embed(c)
        best = min(best, time.perf_counter() - t0)
    return len(SENTENCES) / best


def llama_cpp_child(path: str, threads: int, batches: list[int], reps: int) -> dict[str, float]:
    """llama.cpp's embed() rates per batch size (run in a child process)."""
    from llama_cpp import Llama

    llm = Llama(model_path=path, embedding=True, n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                n_batch=2048, n_ubatch=2048, verbose=False)
    try:
        return {str(b): _time(lambda c: llm.embed(c), b, reps) for b in batches}
    finally:
        llm.close()


def _llama_cpp(path: str, threads: int, batches: list[int], reps: int) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--child", path, "--threads", str(threads),
           "--batches", ",".join(map(str, batches)), "--reps", str(reps)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        print(f"llama.cpp failed: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    if a.child:
        print(json.dumps(llama_cpp_child(a.child, a.threads, batches, a.reps)))
        return 0
    from edge_infer import LLM, hub
    from edge_infer.bench.baseline import baseline_info, format_baseline

    path = str(hub.resolve_model(a.model))
    before = _llama_cpp(path, a.threads, batches, a.reps)
    with LLM(path, n_threads=a.threads) as llm:
        ours = {str(b): _time(llm.embed, b, a.reps) for b in batches}
    after = _llama_cpp(path, a.threads, batches, a.reps)
    rows = []
    for b in batches:
        lc = [r[str(b)] for r in (before, after) if r is not None]
        base = sum(lc) / len(lc) if lc else None
        rows.append({"batch": b, "edge_infer": ours[str(b)], "llama_cpp": base,
                     "llama_cpp_runs": lc, "ratio": ours[str(b)] / base if base else None})
    res = {"model": path, "threads": a.threads, "rows": rows, "llama_cpp_build": baseline_info()}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{path}, {a.threads} threads, embeddings/s over {len(SENTENCES)} sentences")
    print(f"{'batch':>6} {'edge-infer':>11} {'llama.cpp':>10} {'ratio':>6}  llama.cpp runs")
    for r in rows:
        base = f"{r['llama_cpp']:10.1f}" if r["llama_cpp"] else f"{'-':>10}"
        ratio = f"{r['ratio']:6.2f}" if r["ratio"] else f"{'-':>6}"
        print(f"{r['batch']:>6} {r['edge_infer']:11.1f} {base} {ratio}  "
              + ", ".join(f"{x:.1f}" for x in r["llama_cpp_runs"]))
    print(format_baseline(res["llama_cpp_build"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
