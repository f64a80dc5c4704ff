"""LLM lifetime: six LLMs created, used and dropped without close() leave no engine thread
and at most 64 MiB of resident memory behind (after gc only: a user's process does not trim
the C heap by hand, so the finalizer must hand freed memory back itself); a closed LLM refuses
work by name instead of hanging; two live LLMs used at once from two threads give each one's
greedy tokens (their steps take turns)."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import psutil
import pytest

from edge_infer import LLM, SamplingParams
from edge_infer.errors import EdgeInferError

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _engine_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "edge-infer-engine")


def _rss_after_collect() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_dropped_llms_release_threads_and_memory(smollm2_path: Path) -> None:
    before = _engine_threads()
    rss0 = 0
    for i in range(6):
        llm = LLM(str(smollm2_path), n_threads=2, kv_cache_memory="32MiB")
        assert llm.generate(["Hello"], GREEDY)[0].outputs[0].token_ids
        del llm
        rss = _rss_after_collect()
        assert _engine_threads() == before, f"an engine thread outlived LLM {i}"
        if i == 0:
            rss0 = rss  # the first one also leaves the compiled kernels and numba's own threads
    growth = (rss - rss0) / 2**20
    assert growth < 64, f"RSS grew {growth:.0f} MiB over five more LLMs"


def test_closed_llm_refuses_by_name(smollm2_path: Path) -> None:
    llm = LLM(str(smollm2_path), n_threads=1, kv_cache_memory="8MiB")
    llm.close()
    llm.close()  # again: nothing
    with pytest.raises(EdgeInferError, match="closed"):
        llm.generate(["Hello"], GREEDY)
    with pytest.raises(EdgeInferError, match="closed"):
        llm.prompt_logits([1, 2, 3])


def test_two_live_llms_used_at_once(smollm2_path: Path, qwen2_path: Path) -> None:
    prompts = ["The capital of France is", "def fib(n):"]
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="16MiB") as a, \
            LLM(str(qwen2_path), n_threads=2, kv_cache_memory="16MiB") as b:
        alone = {name: m.generate(prompts, GREEDY) for name, m in (("a", a), ("b", b))}
        got: dict[str, list] = {}

        def run(name: str, m: LLM) -> None:
            got[name] = [m.generate(prompts, GREEDY) for _ in range(3)]

        workers = [threading.Thread(target=run, args=(n, m)) for n, m in (("a", a), ("b", b))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=300)
        for name in ("a", "b"):
            want = [o.outputs[0].token_ids for o in alone[name]]
            assert all([o.outputs[0].token_ids for o in outs] == want for outs in got[name]), name
