"""Structured outputs under load: 16 concurrent requests, half of them JSON-schema constrained,
against the same 16 all unconstrained, same run; and the token-mask time per constrained token.

    python benchmarks/bench_structured.py [-m qwen2.5-coder-1.5b] [--requests 16] [--max-tokens 64]
        [--threads 2] [--json]

Aggregate tokens/s = generated tokens / wall time of the whole batch (greedy; unconstrained
requests ignore EOS so they run to max_tokens; constrained ones end with their JSON). The mask
time is measured around each constrained sequence's grammar processor (sync + mask + apply).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from edge_infer import LLM, SamplingParams
from edge_infer.engine import structured
from edge_infer.sampling_params import StructuredOutputsParams

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "language", "stars", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "language": {"enum": ["python", "rust", "go", "c"]},
                         "stars": {"type": "integer", "minimum": 0, "maximum": 100000},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4}}}
MASK_SECONDS: list[float] = []


def _timed_processors() -> None:
    """Wrap every grammar processor the engine builds so its calls are timed."""
    real = structured.GrammarCompiler.processors

    def processors(self: Any, so: StructuredOutputsParams, n: int) -> list[Any]:
        def timed(proc: Any) -> Any:
            def run(prompt: list[int], output: list[int], x: np.ndarray) -> None:
                t = time.perf_counter()
                proc(prompt, output, x)
                MASK_SECONDS.append(time.perf_counter() - t)
            return run
        return [timed(p) for p in real(self, so, n)]

    structured.GrammarCompiler.processors = processors  # type: ignore[method-assign]


def run(llm: LLM, n: int, max_tokens: int, constrained: int) -> dict[str, float]:
    prompts = [llm.chat_prompt([{"role": "user", "content": f"Describe open-source project number {i} as JSON."}])
               for i in range(n)]
    free = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    json_p = SamplingParams(max_tokens=max_tokens, temperature=0.0, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    params = [json_p if i % 2 == 0 and i // 2 < constrained else free for i in range(n)]
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tokens": tokens, "wall_s": wall, "tps": tokens / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    _timed_processors()
    with LLM(a.model, n_threads=a.threads, max_num_seqs=a.requests, kv_cache_memory="512MiB") as llm:
        run(llm, 2, 4, 1)  # warm-up: kernels, and the grammar tokenizer built once
        MASK_SECONDS.clear()
        free_before = run(llm, a.requests, a.max_tokens, 0)
        half = run(llm, a.requests, a.max_tokens, a.requests // 2)
        free_after = run(llm, a.requests, a.max_tokens, 0)
    base = (free_before["tps"] + free_after["tps"]) / 2
    mask_ms = 1e3 * float(np.median(MASK_SECONDS)) if MASK_SECONDS else float("nan")
    res = {"model": a.model, "requests": a.requests, "all_free": {"before": free_before, "after": free_after},
           "half_constrained": half, "ratio": half["tps"] / base, "mask_ms_median": mask_ms,
           "mask_ms_p99": 1e3 * float(np.percentile(MASK_SECONDS, 99)) if MASK_SECONDS else float("nan"),
           "constrained_tokens": len(MASK_SECONDS)}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{a.model}, {a.requests} concurrent requests, {a.threads} threads, greedy")
    print(f"{'all unconstrained':28}{free_before['tps']:>8.1f} tok/s (then {free_after['tps']:.1f} after)")
    print(f"{'half JSON-schema':28}{half['tps']:>8.1f} tok/s   ratio {res['ratio']:.2f}x of the mean unconstrained")
    print(f"mask per constrained token: median {mask_ms:.3f} ms, p99 {res['mask_ms_p99']:.3f} ms "
          f"({res['constrained_tokens']} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
