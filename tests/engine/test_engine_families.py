"""The engine on tiny files of the 2026 families' new parts: gpt-oss (attention sinks, sliding
windows on every other layer, experts with biases and the clamped SwiGLU), gemma4 (per-layer
embedding inputs, KV-shared layers attending over an earlier layer's K/V, sliding-window layers
with their own head size, V = K on the full layers) and gemma3n (AltUp's streams, LAuReL,
activation sparsity): batched and chunked, preempted, resumed from a prefix-cache hit and
decoded with n-gram speculation, each request gives the greedy tokens it gives decoded alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arch_cases import write
from engine.test_engine_tiny import GREEDY, PROMPTS, engine, run, tiny_pool_engine
from gemma3n_models import write_gemma3n
from gemma_models import write_gemma4

from edge_infer import SamplingParams
from edge_infer.cli.inspect import layers
from edge_infer.formats.gguf import GGUFFile


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gemma4(tmp_path_factory.mktemp("gemma4") / "gemma4.gguf", context_length=512)


@pytest.fixture(scope="module", params=["gpt-oss", "gemma4", "gemma3n"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt-oss":
        return write(folder, "gpt-oss", context_length=1024)
    if request.param == "gemma4":
        return write_gemma4(folder / "gemma4.gguf", context_length=512)
    return write_gemma3n(folder / "gemma3n.gguf", context_length=512)


def _ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 250, n)]


def _alone(path: Path, prompt: object, params: SamplingParams = GREEDY) -> list[int]:
    return list(run(engine(path), {"a": (prompt, params)})["a"].outputs[0].token_ids)


def test_kv_pool_holds_only_the_layers_with_kv(gemma4: Path) -> None:
    eng = engine(gemma4)
    runner = eng.runner
    cfg = runner.cfg
    assert cfg.kv_layers == (0, 1, 2, 3) and [cfg.kv_source(i) for i in (4, 5)] == [2, 3]
    assert len(runner.kv_pool) == 4 and runner.kv[4] is runner.kv[2] and runner.kv[5] is runner.kv[3]
    # the sliding-window layers' heads are narrower and more numerous than the full layers'
    assert runner.kv[1][2].shape[2:] == (2, 16) and runner.kv[0][2].shape[2:] == (1, 32)  # V: [block, offset, heads, dim]
    with GGUFFile(gemma4) as f:  # `edge-infer inspect` names the layers without K/V of their own
        assert layers(f)["kinds"] == ["attention"] * 4 + ["shared_kv_attention"] * 2


def test_batched_chunked_and_preempted_equal_alone(model: Path) -> None:
    alone = [_alone(model, p) for p in PROMPTS]
    assert len({tuple(t) for t in alone}) > 2
    got = run(engine(model, max_num_batched_tokens=7), {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert [got[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))] == alone
    eng = tiny_pool_engine(model, 30, max_num_batched_tokens=32)  # 120 tokens for 5 prompts of 4-68
    got = run(eng, {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert eng.scheduler.num_preemptions > 0
    assert [got[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))] == alone


def test_prefix_hit_and_speculation_equal_alone(model: Path) -> None:
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    shared = _ids(120, 1)
    cold = _alone(model, shared + _ids(9, 2), p)
    eng = engine(model)
    run(eng, {"first": (shared + _ids(9, 3), p)})
    before = eng.block_manager.prefix_hits
    assert run(eng, {"hit": (shared + _ids(9, 2), p)})["hit"].outputs[0].token_ids == cold
    assert eng.block_manager.prefix_hits - before >= 112  # the shared prefix's full blocks
    repeat = (_ids(11, 5) * 6)[:60]
    plain = _alone(model, repeat, p)
    spec = engine(model, speculative={"method": "ngram", "k": 4})
    assert run(spec, {"s": (repeat, p)})["s"].outputs[0].token_ids == plain
    m = spec.metrics()
    assert m["spec_proposed_tokens"] > 0, m
