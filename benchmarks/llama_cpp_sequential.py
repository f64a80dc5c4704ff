"""Child process for the batching benchmark: llama.cpp (llama-cpp-python's low-level API) serving
requests one after another, greedy (argmax), a fixed number of tokens each.

    python benchmarks/llama_cpp_sequential.py MODEL THREADS EXTRA_BUFFERS < [[prompt_ids, max_tokens], ...]

Prints one JSON line: tokens_per_s, ttft and inter-token latency percentiles.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    from edge_infer.bench.llamacpp import LlamaCppGreedy

    path, threads, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    reqs = json.loads(sys.stdin.read())
    longest = max(len(p) + n for p, n in reqs)
    ll = LlamaCppGreedy(path, threads, longest + 8, max(len(p) for p, _ in reqs), extra)
    t0 = time.monotonic()
    ttft, itl, total = [], [], 0
    for prompt, n in reqs:
        ll.clear()
        tok = ll.decode(prompt, 0)
        last = time.monotonic()
        ttft.append(last - t0)  # all requests arrive at t0 and wait their turn
        for i in range(n - 1):
            tok = ll.decode([tok], len(prompt) + i)
            now = time.monotonic()
            itl.append(now - last)
            last = now
        total += n
    wall = time.monotonic() - t0
    ll.close()
    print(json.dumps({"output_tokens": total, "wall_s": wall, "tokens_per_s": total / wall,
                      "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
                      "itl_p50_s": float(np.percentile(itl, 50)) if itl else 0.0,
                      "itl_p99_s": float(np.percentile(itl, 99)) if itl else 0.0, "extra_buffers": extra}))


if __name__ == "__main__":
    main()
