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
    import llama_cpp as lc

    path, threads, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    reqs = json.loads(sys.stdin.read())
    quiet = lc.llama_log_callback(lambda level, text, user: None)
    lc.llama_log_set(quiet, None)
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.use_extra_bufts = extra
    model = lc.llama_model_load_from_file(path.encode(), mp)
    longest = max(len(p) + n for p, n in reqs)
    cp = lc.llama_context_default_params()
    cp.n_ctx = longest + 8
    cp.n_batch = cp.n_ubatch = max(len(p) for p, _ in reqs)
    cp.n_threads = cp.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cp)
    nv = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(cp.n_batch, 0, 1)

    def decode(tokens: list[int], pos0: int) -> int:
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return int(np.argmax(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(nv,))))

    t0 = time.monotonic()
    ttft, itl, total = [], [], 0
    for prompt, n in reqs:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        tok = decode(prompt, 0)
        last = time.monotonic()
        ttft.append(last - t0)  # all requests arrive at t0 and wait their turn
        for i in range(n - 1):
            tok = decode([tok], len(prompt) + i)
            now = time.monotonic()
            itl.append(now - last)
            last = now
        total += n
    wall = time.monotonic() - t0
    print(json.dumps({"output_tokens": total, "wall_s": wall, "tokens_per_s": total / wall,
                      "ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
                      "itl_p50_s": float(np.percentile(itl, 50)) if itl else 0.0,
                      "itl_p99_s": float(np.percentile(itl, 99)) if itl else 0.0, "extra_buffers": extra}))


if __name__ == "__main__":
    main()
