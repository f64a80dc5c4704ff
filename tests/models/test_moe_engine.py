"""A mixture-of-experts model under everything above the kernels: paged KV with prefix caching,
continuous batching, preemption by a small KV pool, and speculative decoding all give the
greedy tokens of one request decoded alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from arch_models import write_arch_model

from edge_infer import LLM, SamplingParams

PREFIX = [7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39]  # a full block and more
PROMPTS = [PREFIX + [5, 6, 7, 5, 6, 7, 5, 6], PREFIX + [40, 41, 40, 41, 40], PREFIX + [99] * 6, [3, 4, 3, 4, 3, 4]]
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arch_model(tmp_path_factory.mktemp("moe") / "qwen3moe.gguf", "qwen3moe", experts=(8, 3, 32),
                            context_length=256)


def _alone(path: Path) -> list[list[int]]:
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB", enable_prefix_caching=False) as llm:
        return [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("options", [
    dict(),  # batched, prefix cache on
    dict(speculative={"method": "ngram", "k": 4}),
    dict(kv_cache_memory="48KiB", max_num_batched_tokens=16),  # few blocks: preemption, chunked prefill
], ids=["batched-prefix-cache", "speculative", "small-pool"])
def test_engine_features_keep_greedy_tokens(moe_path: Path, options: dict[str, object]) -> None:
    want = _alone(moe_path)
    kw: dict[str, object] = dict(n_threads=2, kv_cache_memory="16MiB") | options
    with LLM(str(moe_path), **kw) as llm:  # type: ignore[arg-type]
        first = llm.generate(PROMPTS[:1], GREEDY)[0].outputs[0].token_ids  # caches the shared prefix
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
        metrics = llm.metrics()
    assert first == want[0] and got == want
    if "speculative" in options:
        assert metrics["spec_proposed_tokens"] > 0
    elif "max_num_batched_tokens" in options:
        assert metrics["preemptions"] > 0
    else:
        assert metrics["prefix_cache_hit_rate"] > 0
