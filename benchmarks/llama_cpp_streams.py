"""Child process of benchmarks/bench_moe.py: llama.cpp (llama-cpp-python's low-level API)
decoding N streams at once, one token of each stream per llama_decode (its batched decode, as
llama-server does with -np N), greedy (argmax).

    python benchmarks/llama_cpp_streams.py MODEL THREADS EXTRA_BUFFERS N_GEN < [prompt_ids, ...]

Prints one JSON line: decode tokens/s over the N_GEN steps after every stream's prompt is in.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    import llama_cpp as lc

    path, threads, extra, n_gen = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
    prompts: list[list[int]] = json.loads(sys.stdin.read())
    n = len(prompts)
    quiet = lc.llama_log_callback(lambda level, text, user: None)
    lc.llama_log_set(quiet, None)
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.use_extra_bufts = extra
    model = lc.llama_model_load_from_file(path.encode(), mp)
    cp = lc.llama_context_default_params()
    total = sum(len(p) for p in prompts)
    cp.n_ctx = total + n * (n_gen + 8)
    cp.n_batch = cp.n_ubatch = max(total, n)
    cp.n_seq_max = n
    cp.n_threads = cp.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cp)
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(cp.n_batch, 0, n)

    def decode(items: list[tuple[int, int, int, bool]]) -> list[int]:
        """items: (token, position, sequence, wants logits); the argmax of each wanted row."""
        for i, (t, pos, s, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos, 1, want
            batch.seq_id[i][0] = s
        batch.n_tokens = len(items)
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        rows = [i for i, it in enumerate(items) if it[3]]
        return [int(np.argmax(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)))) for i in rows]

    toks = decode([(t, j, s, j == len(p) - 1) for s, p in enumerate(prompts) for j, t in enumerate(p)])
    t0 = time.perf_counter()
    for step in range(n_gen):
        toks = decode([(toks[s], len(p) + step, s, True) for s, p in enumerate(prompts)])
    wall = time.perf_counter() - t0
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    print(json.dumps({"streams": n, "decode_tps": n * n_gen / wall, "wall_s": wall, "extra_buffers": extra}))


if __name__ == "__main__":
    main()
