"""The engine on a tiny gpt-oss file (attention sinks, sliding windows on every other layer, a
mixture of experts with biases and the clamped SwiGLU): batched and chunked, preempted, resumed
from a prefix-cache hit and decoded with n-gram speculation, each request gives the greedy
tokens it gives decoded alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arch_cases import write
from engine.test_engine_tiny import GREEDY, PROMPTS, engine, run, tiny_pool_engine

from edge_infer import SamplingParams


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("gpt-oss"), "gpt-oss", context_length=1024)


def _ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 250, n)]


def _alone(path: Path, prompt: object, params: SamplingParams = GREEDY) -> list[int]:
    return list(run(engine(path), {"a": (prompt, params)})["a"].outputs[0].token_ids)


def test_batched_chunked_and_preempted_equal_alone(gpt_oss: Path) -> None:
    alone = [_alone(gpt_oss, p) for p in PROMPTS]
    assert len({tuple(t) for t in alone}) > 2
    got = run(engine(gpt_oss, max_num_batched_tokens=7), {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert [got[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))] == alone
    eng = tiny_pool_engine(gpt_oss, 30, max_num_batched_tokens=32)  # 120 tokens for 5 prompts of 4-68
    got = run(eng, {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert eng.scheduler.num_preemptions > 0
    assert [got[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))] == alone


def test_prefix_hit_and_speculation_equal_alone(gpt_oss: Path) -> None:
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    shared = _ids(120, 1)
    cold = _alone(gpt_oss, shared + _ids(9, 2), p)
    eng = engine(gpt_oss)
    run(eng, {"first": (shared + _ids(9, 3), p)})
    before = eng.block_manager.prefix_hits
    assert run(eng, {"hit": (shared + _ids(9, 2), p)})["hit"].outputs[0].token_ids == cold
    assert eng.block_manager.prefix_hits - before >= 112  # the shared prefix's full blocks
    repeat = (_ids(11, 5) * 6)[:60]
    plain = _alone(gpt_oss, repeat, p)
    spec = engine(gpt_oss, speculative={"method": "ngram", "k": 4})
    assert run(spec, {"s": (repeat, p)})["s"].outputs[0].token_ids == plain
    m = spec.metrics()
    assert m["spec_proposed_tokens"] > 0, m
