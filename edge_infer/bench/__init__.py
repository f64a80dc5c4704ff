"""Measurements: prefill/decode speed side by side with llama.cpp (pp_tg, with llama.cpp in a
child process: llamacpp), serving workloads driven through the engine (workloads, serving) and
perplexity as llama-perplexity computes it (perplexity). Used by `edge-infer bench`,
`edge-infer perplexity` and the scripts in benchmarks/.

Nothing is imported here, so a child process started with `python -m edge_infer.bench.llamacpp`
loads only what it needs.
"""
