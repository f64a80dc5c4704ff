"""Child process for the speculative-decoding benchmark: llama-cpp-python's high-level Llama,
plain and with its prompt-lookup decoding (LlamaPromptLookupDecoding), greedy.

    python benchmarks/llama_cpp_lookup.py MODEL THREADS MAX_TOKENS K EXTRA_BUFFERS < prompt.txt

Prints one JSON line {"plain_tps", "lookup_tps"} (generated tokens / generation time).
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path, threads, max_tokens, k, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    prompt = sys.stdin.read()
    import llama_cpp.llama_cpp as low

    default_params = low.llama_model_default_params

    def params():  # type: ignore[no-untyped-def]
        p = default_params()
        p.use_extra_bufts = extra == "1"  # this CPU's AMX path can crash: the caller retries without
        return p

    low.llama_model_default_params = params
    res = {}
    for name, draft in (("plain", None), ("lookup", LlamaPromptLookupDecoding(num_pred_tokens=k))):
        llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False,
                              draft_model=draft, logits_all=draft is not None)
        llm.create_completion(prompt, max_tokens=2, temperature=0.0)  # warm-up
        t0 = time.perf_counter()
        out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
        dt = time.perf_counter() - t0
        res[f"{name}_tps"] = out["usage"]["completion_tokens"] / dt
        res[f"{name}_tokens"] = out["usage"]["completion_tokens"]
        del llm
    print(json.dumps(res))


if __name__ == "__main__":
    main()
