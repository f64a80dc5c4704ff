"""The forward's scratch is the backend's preallocated workspace: a step allocates no array but
the logits it hands back (counted through a numpy memory handler), on every architecture and
on a real model with int8 matrices, on a mixture of experts; a step larger than the workspace grows it, same logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arch_models import write_arch_model
from numpy_allocations import counting_allocations
from tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_qwen2

from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine
from edge_infer.sampling_params import SamplingParams


def _engine(path: Path, **options: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), n_threads=1, kv_cache_memory="16MiB", **options))  # type: ignore[arg-type]


def _allocations_per_forward(eng: LLMEngine, steps: int) -> list[int]:
    """Runs two requests to the end; numpy allocations inside each forward."""
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    eng.add_request("a", [1, 2, 3, 4, 5, 6, 7], params)
    eng.add_request("b", [8, 9, 10], params)
    model = eng.runner.model
    forward, counts = model.forward_sampled, []

    def counted(inp, kv, *rest):  # type: ignore[no-untyped-def]
        with counting_allocations() as n:
            logits = forward(inp, kv, *rest)
        counts.append(n[0])
        return logits

    model.forward_sampled = counted  # type: ignore[method-assign]
    while eng.has_unfinished_requests():
        eng.step()
    return counts


def write_tiny_moe(path: Path) -> Path:
    """qwen2moe, Q8_0: routed experts on the int8 path and a shared expert."""
    return write_arch_model(path, "qwen2moe", qtype="Q8_0", experts=(8, 2, 32), shared_ffn=64)


@pytest.mark.parametrize("writer", [write_tiny_llama, write_tiny_qwen2, write_tiny_gemma3, write_tiny_moe])
def test_a_step_allocates_only_its_logits(writer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    eng = _engine(writer(tmp_path / "m.gguf"))
    counts = _allocations_per_forward(eng, steps=10)
    assert len(counts) >= 10  # the prefill step (logits of its last rows only) and the decodes
    assert counts == [1] * len(counts), counts


@pytest.mark.slow
def test_real_model_with_int8_matrices_allocates_only_its_logits(smollm2_path: Path) -> None:
    eng = _engine(smollm2_path)
    assert any(lw.wq.packed is not None for lw in eng.runner.model.w.layers)  # Q4_1: the int8 path
    counts = _allocations_per_forward(eng, steps=10)
    assert counts == [1] * len(counts), counts


def test_a_step_larger_than_the_workspace_grows_it(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf")
    ids = list(range(1, 40))
    want = _engine(path).score(ids)
    eng = _engine(path)
    model = eng.runner.model
    cfg = model.cfg
    model.ws = model.b.make_workspace(2, cfg.d_model, cfg.q_dim, cfg.kv_dim, cfg.ffn_dim)
    got = eng.score(ids)
    assert model.ws.capacity >= len(ids)
    np.testing.assert_array_equal(got, want)
