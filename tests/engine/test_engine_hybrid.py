"""The engine on tiny hybrid models (lfm2: short convolutions and attention; granitehybrid:
Mamba2 blocks and attention; qwen35: Gated DeltaNet and gated attention; nemotron_h: Mamba2,
attention and FFN layers apart; falcon-h1: KV and a state in every layer): each sequence's
recurrent state lives in a slot the block manager hands out, and every way the engine moves a
sequence gives the greedy tokens of the sequence decoded alone: batched with others, chunked,
preempted and recomputed (slots given back and taken again), n > 1 samples forked from the
leader's state, a prefix-cache hit resumed from the state snapshot at its end (the same
prompt again, a shared prefix, snapshots evicted), n-gram speculation whose rejected proposals
roll the state back to the last accepted position. What cannot work is refused by name: a
hybrid draft model, more samples than slots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine.test_engine_tiny import GREEDY, PROMPTS, engine, run
from hybrid_models import write_falcon_h1, write_granitehybrid, write_lfm2, write_nemotron_h, write_qwen35

from edge_infer import LLM, SamplingParams
from edge_infer.engine.loader import SPARE_STATE_SLOTS
from edge_infer.engine.model_runner import kv_block_bytes
from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models import config_from_gguf

WRITERS = {"lfm2": write_lfm2, "granitehybrid": write_granitehybrid, "qwen35": write_qwen35,
           "nemotron_h": write_nemotron_h, "falcon-h1": write_falcon_h1}


@pytest.fixture(scope="module", params=list(WRITERS))
def hybrid(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return WRITERS[request.param](tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf", context_length=1024)


@pytest.fixture(scope="module")
def alone_tokens(hybrid: Path) -> list[list[int]]:
    return [run(engine(hybrid), {"a": (p, GREEDY)})["a"].outputs[0].token_ids for p in PROMPTS]


def _free_slots(eng: Any) -> int:
    states = eng.block_manager.states
    assert states is not None
    return len(states.free)


def _tokens(outs: dict) -> list[list[int]]:  # type: ignore[type-arg]
    return [outs[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))]


def test_batched_and_chunked_equal_alone(hybrid: Path, alone_tokens: list[list[int]]) -> None:
    assert len({tuple(t) for t in alone_tokens}) > 2  # the prompts lead to different tokens
    eng = engine(hybrid, max_num_batched_tokens=7)
    got = run(eng, {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)})
    assert _tokens(got) == alone_tokens
    assert eng.plan.num_state_slots == 32 + SPARE_STATE_SLOTS and eng.plan.state_cache_bytes > 0
    assert _free_slots(eng) == eng.plan.num_state_slots  # every slot given back


def test_preempted_and_recomputed_equal_alone(hybrid: Path) -> None:
    """A pool of 5 sequences' states (at most half the budget) and at least 24 KV blocks of 4
    tokens, with 5 prompts that together need about 1.75 times the KV pool."""
    with GGUFFile(hybrid) as f:
        cfg = config_from_gguf(f)
    seqs, snaps = 5, 2  # recomputed prompts may resume from a snapshot
    states = (seqs + SPARE_STATE_SLOTS + snaps) * cfg.state_bytes
    memory = max(2 * (seqs + SPARE_STATE_SLOTS) * cfg.state_bytes, states + 24 * kv_block_bytes(CpuBackend, cfg, 4, "f16"))
    # prompts prefill side by side in chunks of a small step (no cap while others decode), so all
    # five are admitted and contend for the blocks (however large a state is beside a KV block)
    eng = engine(hybrid, kv_cache_memory=memory, block_size=4, max_num_seqs=seqs, state_snapshots=snaps,
                 prefill_chunk_while_decoding=0, max_num_batched_tokens=32)
    assert eng.plan.num_state_slots == seqs + SPARE_STATE_SLOTS and eng.plan.num_kv_blocks >= 24
    length = max(40, int(0.35 * eng.plan.kv_capacity_tokens))
    prompts = [_ids(length, 20 + i) for i in range(5)]
    want = [run(engine(hybrid), {"a": (q, GREEDY)})["a"].outputs[0].token_ids for q in prompts]
    got = run(eng, {str(i): (q, GREEDY) for i, q in enumerate(prompts)})
    assert eng.scheduler.num_preemptions > 0
    assert [got[str(i)].outputs[0].token_ids for i in range(5)] == want
    assert _free_slots(eng) == seqs + SPARE_STATE_SLOTS


def test_forked_samples_start_from_the_leaders_state(hybrid: Path, alone_tokens: list[list[int]]) -> None:
    eng = engine(hybrid)
    outs = run(eng, {"g": (PROMPTS[2], SamplingParams(n=3, temperature=0, max_tokens=24, ignore_eos=True))})
    assert [o.token_ids for o in outs["g"].outputs] == [alone_tokens[2]] * 3
    p = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    first = [o.token_ids for o in run(eng, {"s": (PROMPTS[0], p)})["s"].outputs]
    assert len({tuple(t) for t in first}) > 1
    assert [o.token_ids for o in run(engine(hybrid), {"s": (PROMPTS[0], p)})["s"].outputs] == first
    assert _free_slots(eng) == eng.plan.num_state_slots


def test_ngram_speculation_rolls_the_state_back(hybrid: Path) -> None:
    """Prompts that repeat, so prompt lookup proposes; some proposals are rejected (the random
    model does not continue the pattern), some accepted."""
    prompts = [(_ids(24, 5) * 4)[:80], (_ids(9, 6) * 8)[:60], [7, 8, 9, 10] * 12]
    p = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = [run(engine(hybrid), {"r": (q, p)})["r"].outputs[0].token_ids for q in prompts]
    eng = engine(hybrid, speculative={"method": "ngram", "k": 4}, max_num_batched_tokens=64, max_num_seqs=4)
    got = run(eng, {str(i): (q, p) for i, q in enumerate(prompts)})
    assert [got[str(i)].outputs[0].token_ids for i in range(len(prompts))] == plain
    m = eng.metrics()
    assert 0 < m["spec_accepted_tokens"] < m["spec_proposed_tokens"], m
    states = eng.block_manager.states
    assert states is not None and len(states.free_spec) == states.num_spec and _free_slots(eng) == states.num_seq_slots


def test_what_cannot_work_is_refused(hybrid: Path, tiny_llama_path: Path) -> None:
    eng = engine(hybrid, max_num_seqs=1)
    slots = 1 + SPARE_STATE_SLOTS
    with pytest.raises(InvalidRequest, match=rf"n={slots + 1} samples need as many recurrent-state slots.*has {slots}"):
        eng.add_request("r", "abc", SamplingParams(n=slots + 1, max_tokens=2))
    with pytest.raises(UnsupportedModelError, match=r"speculative draft model .*(lfm2|granitehybrid|qwen35|nemotron_h|falcon-h1) has recurrent layers"):
        LLM(str(tiny_llama_path), n_threads=1, kv_cache_memory="8MiB",
            speculative={"method": "draft", "model": str(hybrid)})


def _ids(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 250, n)]


def test_prefix_hits_resume_from_state_snapshots(hybrid: Path) -> None:
    """block_size 16, a snapshot every 4 blocks and at each prompt's last full block."""
    shared, a, b = _ids(300, 1), _ids(37, 2), _ids(50, 3)
    p = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = {"a": shared + a, "a-again": shared + a, "b": shared + b}
    cold = {k: run(engine(hybrid, enable_prefix_caching=False), {k: (v, p)})[k].outputs[0].token_ids
            for k, v in prompts.items()}
    eng = engine(hybrid, state_snapshot_interval=4)
    hits = []
    for k in ("a", "a-again", "b"):
        before = eng.block_manager.prefix_hits
        assert run(eng, {k: (prompts[k], p)})[k].outputs[0].token_ids == cold[k], k
        hits.append(eng.block_manager.prefix_hits - before)
    # again: every full block of the prompt (337 tokens: 21 blocks, the last one's snapshot);
    # a shared 300-token prefix: to the last snapshot before it (block 16, every 4th)
    assert hits == [0, 21 * 16, 16 * 16]
    assert eng.metrics()["state_snapshots"] > 0 and _free_slots(eng) == eng.plan.num_state_slots


def test_evicted_snapshots_fall_back_to_an_earlier_one(hybrid: Path) -> None:
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = _ids(200, 4)
    cold = run(engine(hybrid, enable_prefix_caching=False), {"c": (prompt, p)})["c"].outputs[0].token_ids
    eng = engine(hybrid, state_snapshots=2, state_snapshot_interval=2)  # 12 full blocks, room for 2 snapshots
    run(eng, {"first": (prompt, p)})
    for i in range(3):  # others take the snapshot slots, least recently used first
        run(eng, {f"other{i}": (_ids(40, 10 + i), p)})
    before = eng.block_manager.prefix_hits
    assert run(eng, {"again": (prompt, p)})["again"].outputs[0].token_ids == cold
    assert eng.block_manager.prefix_hits - before < 12 * 16  # not the whole prompt: its snapshots went
    off = engine(hybrid, state_snapshots=0)
    assert not off.block_manager.enable_prefix_caching and off.plan.num_state_snapshots == 0


def test_states_on_disk_resume_a_prompt(hybrid: Path, tmp_path: Path) -> None:
    """The disk prefix cache keeps a hybrid's state snapshots beside their blocks. One snapshot
    slot, taken at the prompt's last full block (12 blocks of 16): other prompts take the slot, the
    prompt's snapshot is saved as it is let go, and the prompt again resumes from it (its blocks
    are still in memory); a later engine loads the blocks and that state from disk. Each time the
    whole prompt is a hit and the tokens are a cold run's; a damaged state file is a miss."""
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = _ids(200, 5)
    cold = run(engine(hybrid, enable_prefix_caching=False), {"c": (prompt, p)})["c"].outputs[0].token_ids
    cache = tmp_path / "cache"
    opts: dict[str, Any] = {"prefix_cache_dir": str(cache), "state_snapshots": 1, "state_snapshot_interval": 100}
    eng = engine(hybrid, **opts)
    run(eng, {"first": (prompt, p)})
    for i in range(2):
        run(eng, {f"other{i}": (_ids(40, 30 + i), p)})
    assert eng.metrics()["state_snapshots"] == 1
    before = eng.block_manager.prefix_hits
    assert run(eng, {"again": (prompt, p)})["again"].outputs[0].token_ids == cold
    assert eng.block_manager.prefix_hits - before == 12 * 16
    assert eng.metrics()["disk_hits"] == 1  # the state alone: the blocks were in memory
    eng.close()
    assert len(list(cache.glob("*/*/*.st"))) == 3  # the prompt's and the others' last blocks
    later = engine(hybrid, **opts)
    assert run(later, {"b": (prompt, p)})["b"].outputs[0].token_ids == cold
    assert later.block_manager.prefix_hits == 12 * 16
    assert later.metrics()["disk_hits"] == 12 + 1
    later.close()
    for f in cache.glob("*/*/*.st"):  # a damaged state is a miss: no hit without one, same tokens
        f.write_bytes(f.read_bytes()[:-5] + b"xxxxx")
    damaged = engine(hybrid, **opts)
    assert run(damaged, {"d": (prompt, p)})["d"].outputs[0].token_ids == cold
    assert damaged.block_manager.prefix_hits == 0 and damaged.metrics()["disk_corrupt"] == 1
    damaged.close()
