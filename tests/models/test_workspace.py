"""The forward's scratch is the backend's preallocated workspace: a step allocates no array but
the logits it hands back (counted through a numpy memory handler), on every architecture and
on a real model with int8 matrices, on a mixture of experts; a step larger than the workspace grows it, same logits.
Both backends build it from one table of shapes by field name (Workspace.allocate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arch_models import write_arch_model
from numpy_allocations import counting_allocations
from tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_qwen2

from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine
from edge_infer.kernels_cpu.workspace import (
    ExpertWorkspace,
    Workspace,
    expert_shapes,
    make_workspace,
    workspace_shapes,
)
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


def test_every_buffer_is_allocated_by_its_field_name() -> None:
    made: list[tuple[tuple[int, ...], type]] = []

    def empty(shape: tuple[int, ...], dtype: type) -> np.ndarray:
        made.append((shape, dtype))
        return np.empty(shape, dtype)

    t, d, q, kv, f = 4, 64, 96, 32, 128  # K_max = 128
    ws = Workspace.allocate(empty, t, workspace_shapes(t, d, q, kv, f))
    assert len(made) == 42 and ws.capacity == t and ws.moe is None
    assert ws.x0.shape == ws.ple_in.shape == (t, 0)  # no per-layer embedding input: empty
    assert ws.rec_in.shape == ws.rec_y.shape == ws.rec_out.shape == (t, 0)  # no recurrent block: empty
    assert ws.h.shape == (t, d) and ws.k.shape == (t, kv) and ws.attn.shape == (t, q) and ws.act.shape == (t, f)
    assert ws.seq_rows.shape == (t,) and ws.seq_rows.dtype == np.int32 and ws.no_out.shape == (t, 0)
    assert (ws.xq4.shape, ws.xd.shape, ws.xsum.shape, ws.xs16.shape) == ((128,), (16,), (16,), (32,))
    rows = workspace_shapes(t, d, q, kv, f, per_row=True)  # the CUDA backend's: sliced [:n, :K/g]
    assert (rows["xq4"][0], rows["xd"][0], rows["xs16"][0]) == ((t, 32), (t, 4), (t, 8))

    moe = ExpertWorkspace.allocate(empty, expert_shapes(t, d, 8, 2, 32))  # P = 8 pairs, K_max = 64
    assert moe.logits.shape == (t, 8) and moe.offsets.shape == (9,) and moe.xg.shape == (8, d)
    assert moe.xq4.shape == (8 * 64 // 4,) and moe.xs16.dtype == np.int32
    assert make_workspace(t, d, q, kv, f, (8, 2, 32)).moe is not None
    hybrid = make_workspace(t, d, q, kv, f, recurrent=(700, 300, 256, 0, 0))  # Mamba2: out_proj's input the widest
    assert hybrid.rec_in.shape == (t, 700) and hybrid.rec_mid.shape == (t, 300) and hybrid.rec_out.shape == (t, 256)
    assert hybrid.xq4.shape == (t * 256 // 4,) and hybrid.o_rows.shape == (t, d) and hybrid.qg.shape == (t, 0)
    gated = make_workspace(t, d, q, kv, f, recurrent=(160, 160, 64, 64, 4), gated_attention=True)  # qwen35
    assert gated.qg.shape == (t, 2 * q) and gated.q_gate_rows.shape == (t, q) and gated.rec_beta.shape == (t, 4)


def test_a_shape_table_must_name_exactly_the_fields() -> None:
    shapes = workspace_shapes(2, 32, 32, 32, 32)
    del shapes["o2"]
    with pytest.raises(ValueError, match=r"missing \['o2'\], unknown \[\]"):
        Workspace.allocate(np.empty, 2, shapes)
    with pytest.raises(ValueError, match=r"unknown \['extra'\]"):
        ExpertWorkspace.allocate(np.empty, {**expert_shapes(2, 32, 4, 2, 32), "extra": ((1,), np.float32)})
