"""The engine on a tiny hybrid model (lfm2: short convolutions and attention): each sequence's
recurrent state lives in a slot the block manager hands out, and every way the engine moves a
sequence gives the greedy tokens of the sequence decoded alone: batched with others, chunked,
preempted and recomputed (slots given back and taken again), n > 1 samples forked from the
leader's state. What cannot work yet is refused by name: speculation (a state has no rollback),
more samples than slots."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine.test_engine_tiny import GREEDY, PROMPTS, engine, run
from hybrid_models import write_lfm2

from edge_infer import LLM, SamplingParams
from edge_infer.engine.loader import SPARE_STATE_SLOTS
from edge_infer.engine.model_runner import kv_block_bytes
from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models import config_from_gguf


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lfm2(tmp_path_factory.mktemp("hybrid") / "lfm2.gguf")


@pytest.fixture(scope="module")
def alone_tokens(hybrid: Path) -> list[list[int]]:
    return [run(engine(hybrid), {"a": (p, GREEDY)})["a"].outputs[0].token_ids for p in PROMPTS]


def _tokens(outs: dict) -> list[list[int]]:  # type: ignore[type-arg]
    return [outs[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))]


def test_batched_and_chunked_equal_alone(hybrid: Path, alone_tokens: list[list[int]]) -> None:
    assert len({tuple(t) for t in alone_tokens}) > 2  # the prompts lead to different tokens
    eng = engine(hybrid, max_num_batched_tokens=7)
    got = run(eng, {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert _tokens(got) == alone_tokens
    assert eng.plan.num_state_slots == 32 + SPARE_STATE_SLOTS and eng.plan.state_cache_bytes > 0
    assert len(eng.block_manager.free_slots) == eng.plan.num_state_slots  # every slot given back
    again = run(eng, {"r": (PROMPTS[2], GREEDY)})["r"].outputs[0].token_ids
    assert again == alone_tokens[2] and eng.block_manager.prefix_hits == 0  # no prefix cache without states


def test_preempted_and_recomputed_equal_alone(hybrid: Path, alone_tokens: list[list[int]]) -> None:
    with GGUFFile(hybrid) as f:
        cfg = config_from_gguf(f)
    seqs = 5
    memory = 24 * kv_block_bytes(CpuBackend, cfg, 4, "f16") + (seqs + SPARE_STATE_SLOTS) * cfg.state_bytes
    eng = engine(hybrid, kv_cache_memory=memory, block_size=4, max_num_seqs=seqs)
    assert eng.plan.num_kv_blocks == 24
    got = run(eng, {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert eng.scheduler.num_preemptions > 0
    assert _tokens(got) == alone_tokens
    assert len(eng.block_manager.free_slots) == seqs + SPARE_STATE_SLOTS


def test_forked_samples_start_from_the_leaders_state(hybrid: Path, alone_tokens: list[list[int]]) -> None:
    eng = engine(hybrid)
    outs = run(eng, {"g": (PROMPTS[2], SamplingParams(n=3, temperature=0, max_tokens=24, ignore_eos=True))})
    assert [o.token_ids for o in outs["g"].outputs] == [alone_tokens[2]] * 3
    p = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    first = [o.token_ids for o in run(eng, {"s": (PROMPTS[0], p)})["s"].outputs]
    assert len({tuple(t) for t in first}) > 1
    assert [o.token_ids for o in run(engine(hybrid), {"s": (PROMPTS[0], p)})["s"].outputs] == first
    assert len(eng.block_manager.free_slots) == eng.plan.num_state_slots


def test_what_cannot_work_is_refused(hybrid: Path, tiny_llama_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match=r"speculative decoding: lfm2 has recurrent layers"):
        LLM(str(hybrid), n_threads=1, kv_cache_memory="8MiB", speculative={"method": "ngram"})
    eng = engine(hybrid, max_num_seqs=1)
    slots = 1 + SPARE_STATE_SLOTS
    with pytest.raises(InvalidRequest, match=rf"n={slots + 1} samples need as many recurrent-state slots.*has {slots}"):
        eng.add_request("r", "abc", SamplingParams(n=slots + 1, max_tokens=2))
    with pytest.raises(UnsupportedModelError, match=r"speculative draft model .*lfm2 has recurrent layers"):
        LLM(str(tiny_llama_path), n_threads=1, kv_cache_memory="8MiB",
            speculative={"method": "draft", "model": str(hybrid)})
