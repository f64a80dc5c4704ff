"""llama.cpp side of `edge-infer bench`, run as a child process:

    python -m edge_infer.bench_llama_cpp MODEL THREADS N_PROMPT N_GEN REPS SEED VOCAB EXTRA_BUFFERS

Prints one JSON line {"pp_tps", "tg_tps", "pp_all", "tg_all"}. Uses llama-cpp-python's low-level
API: the prompt in one batch (logits for its last token only), then N_GEN single-token decodes
taking the argmax of the logits. EXTRA_BUFFERS=1 lets llama.cpp repack weights (its fastest
CPU path); 0 keeps them as they are in the file.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np


def main(argv: list[str]) -> int:
    import llama_cpp as lc

    from edge_infer.bench import bench_prompt

    path, threads, n_prompt, n_gen, reps, seed, vocab, extra = argv
    threads_i, n_prompt_i, n_gen_i = int(threads), int(n_prompt), int(n_gen)
    prompt = bench_prompt(int(vocab), n_prompt_i, int(seed))
    quiet = lc.llama_log_callback(lambda level, text, user: None)  # keep a reference: C calls it later
    lc.llama_log_set(quiet, None)
    lc.llama_backend_init()
    mp = lc.llama_model_default_params()
    mp.use_extra_bufts = extra == "1"
    model = lc.llama_model_load_from_file(path.encode(), mp)
    cp = lc.llama_context_default_params()
    cp.n_ctx = n_prompt_i + n_gen_i + 16
    cp.n_batch = cp.n_ubatch = max(n_prompt_i, 1)
    cp.n_threads = cp.n_threads_batch = threads_i
    ctx = lc.llama_init_from_model(model, cp)
    nv = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(max(n_prompt_i, 1), 0, 1)

    def decode(tokens: list[int], pos0: int) -> int:
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        return int(np.argmax(np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, -1), shape=(nv,))))

    pp, tg = [], []
    decode(prompt[:16], 0)  # warm-up
    for _ in range(int(reps)):
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        tok = decode(prompt, 0)
        pp.append(n_prompt_i / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for i in range(n_gen_i):
            tok = decode([tok], n_prompt_i + i)
        tg.append(n_gen_i / (time.perf_counter() - t0))
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    print(json.dumps({"pp_tps": statistics.median(pp), "tg_tps": statistics.median(tg), "pp_all": pp, "tg_all": tg}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
