"""llama.cpp side of `edge-infer bench`, run as a child process:

    python -m edge_infer.bench.llamacpp MODEL THREADS N_PROMPT N_GEN REPS SEED VOCAB EXTRA_BUFFERS

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


class LlamaCppGreedy:
    """One llama.cpp model and context (low-level API): decode() feeds tokens at positions and
    returns the argmax of the last token's logits. extra_buffers lets llama.cpp repack weights."""

    def __init__(self, path: str, threads: int, n_ctx: int, n_batch: int, extra_buffers: bool,
                 kv_types: tuple[str, str] = ("f16", "f16")) -> None:
        import llama_cpp as lc

        self.lc = lc
        self._quiet = lc.llama_log_callback(lambda level, text, user: None)  # C keeps calling it
        lc.llama_log_set(self._quiet, None)
        lc.llama_backend_init()
        mp = lc.llama_model_default_params()
        mp.use_extra_bufts = extra_buffers
        self.model = lc.llama_model_load_from_file(path.encode(), mp)
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = max(n_batch, 1)
        cp.n_threads = cp.n_threads_batch = threads
        if kv_types != ("f16", "f16"):  # llama.cpp's -ctk / -ctv; a quantized V needs flash attention
            from edge_infer.formats.weight_types import by_name

            cp.type_k, cp.type_v = (by_name(t.upper()).id for t in kv_types)
            cp.flash_attn_type = 1
        self.ctx = lc.llama_init_from_model(self.model, cp)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(cp.n_batch, 0, 1)

    def clear(self) -> None:
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list[int], pos0: int) -> int:
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == len(tokens) - 1
        b.n_tokens = len(tokens)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        logits = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,))
        return int(np.argmax(logits))

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)


def main(argv: list[str]) -> int:
    from edge_infer.bench.pp_tg import bench_prompt

    path, threads, n_prompt, n_gen, reps, seed, vocab, kv_k, kv_v, extra = argv
    n_prompt_i, n_gen_i = int(n_prompt), int(n_gen)
    prompt = bench_prompt(int(vocab), n_prompt_i, int(seed))
    ll = LlamaCppGreedy(path, int(threads), n_prompt_i + n_gen_i + 16, n_prompt_i, extra == "1", (kv_k, kv_v))
    pp, tg = [], []
    ll.decode(prompt[:16], 0)  # warm-up
    for _ in range(int(reps)):
        ll.clear()
        t0 = time.perf_counter()
        tok = ll.decode(prompt, 0)
        pp.append(n_prompt_i / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for i in range(n_gen_i):
            tok = ll.decode([tok], n_prompt_i + i)
        tg.append(n_gen_i / (time.perf_counter() - t0))
    ll.close()
    print(json.dumps({"pp_tps": statistics.median(pp), "tg_tps": statistics.median(tg), "pp_all": pp, "tg_all": tg}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
