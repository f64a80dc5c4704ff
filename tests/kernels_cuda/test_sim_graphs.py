"""Replayed steps (kernels_cuda/graphs.py: a recorded forward per padded token count and
attention-partition count, replayed with new inputs copied into its buffers) compute exactly
what eager steps compute, and greedy rows cross to the host as argmax ids.

Under the simulator a replay runs the recorded launch list (what a CUDA graph is captured from
on a device): every argument a replay has was fixed when it was recorded, so a value that
should have changed with the step (a pointer, a count, a grid) would show here as a wrong
result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_sim import ON_CUDA
from tiny_models import write_tiny_llama

from edge_infer import LLM, SamplingParams
from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine
from edge_infer.models.transformer import StepInputs

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="runs in the CUDA simulator's own process, or on a GPU")

SHAPE = {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "ffn": 64}


def _engine(path: Path, eager: bool) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), device="cuda", kv_cache_memory="1MiB", max_model_len=512,
                                  enforce_eager=eager))


def _step(seqs: list[tuple[list[int], int, list[int]]], bs: int) -> StepInputs:
    """StepInputs of sequences (tokens, first position, block table), every token's logits."""
    tokens, pos, slots, tseq = [], [], [], []
    for si, (toks, start, table) in enumerate(seqs):
        for j, t in enumerate(toks):
            p = start + j
            tokens.append(t)
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            tseq.append(si)
    width = max(len(t) for _, _, t in seqs)
    tables = np.zeros((len(seqs), width), np.int32)
    for si, (_, _, t) in enumerate(seqs):
        tables[si, : len(t)] = t
    n = len(tokens)
    return StepInputs(np.array(tokens, np.int32), np.array(pos, np.int32), np.array(slots, np.int64),
                      np.array(tseq, np.int32), tables, np.arange(n, dtype=np.int64))


def _kv_host(eng: LLMEngine) -> list[np.ndarray]:
    return [a.copy_to_host() for layer in eng.runner.kv for a in (layer[0], layer[2])]


def test_replayed_steps_equal_eager_ones_across_buckets(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path, qtype="Q4_0", **SHAPE)
    graph, eager = _engine(path, eager=False), _engine(path, eager=True)
    backend = graph.runner.backend
    before = backend.graph_replays  # the load's warm-up step may have been one
    rng = np.random.default_rng(0)
    for layer_g, layer_e in zip(graph.runner.kv, eager.runner.kv):  # the same random cache in both
        for i in (0, 2):
            a = rng.normal(0, 1, layer_g[i].shape).astype(layer_g[i].dtype)
            layer_g[i].copy_to_device(a)
            layer_e[i].copy_to_device(a)
    bs = graph.config.block_size
    t1, t2, t3 = list(range(0, 40)), list(range(40, 80)), list(range(80, 120))  # block tables
    steps = [
        [([5], 20, t1), ([9], 100, t2)],  # 2 tokens: bucket 2, one partition
        [([6], 21, t1), ([10], 101, t2)],  # the same graph, new positions
        [([7], 22, t1), ([11], 102, t2), ([3], 7, t3)],  # 3 tokens padded to 4
        [([8], 260, t1)],  # position past the first partition: 2 partitions, a new graph
        [([1, 2, 3, 4], 30, t2)],  # a verification-shaped step: 4 tokens of one sequence
        [([12], 23, t1), ([13], 103, t2)],  # back to the first graph
    ]
    for step in steps:
        got = graph.runner.model.forward(_step(step, bs), graph.runner.kv)
        want = eager.runner.model.forward(_step(step, bs), eager.runner.kv)
        assert got.shape == want.shape == (sum(len(s[0]) for s in step), graph.model_config.vocab_size)
        np.testing.assert_array_equal(got, want)
    assert {(1, 2), (2, 1)} <= set(backend._steps.graphs)  # recorded after the last growth (which drops the others)
    assert backend.graph_replays == before + len(steps) and eager.runner.backend.graph_replays == 0
    for a, b in zip(_kv_host(graph), _kv_host(eager)):  # padding tokens wrote no KV
        np.testing.assert_array_equal(a, b)


def test_a_prefill_step_is_not_replayed(tmp_path: Path) -> None:
    eng = _engine(write_tiny_llama(tmp_path, qtype="Q4_0", **SHAPE), eager=False)
    backend = eng.runner.backend
    before, graphs = backend.graph_replays, set(backend._steps.graphs)  # the load's warm-up may have made one
    inp = _step([(list(range(1, 9)), 0, list(range(4)))], eng.config.block_size)
    inp.logits_rows = np.array([7], np.int64)  # the last token's logits only: a prefill
    eng.runner.model.forward(inp, eng.runner.kv)
    assert backend.graph_replays == before and set(backend._steps.graphs) == graphs


def _generate(path: Path, device: str, **opts: Any) -> tuple[list[Any], int, float]:
    greedy = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    sampled = SamplingParams(max_tokens=5, temperature=0.9, seed=3, logprobs=2, ignore_eos=True)
    greedy_lp = SamplingParams(max_tokens=5, temperature=0.0, logprobs=1, ignore_eos=True)
    with LLM(str(path), device=device, kv_cache_memory="1MiB", max_model_len=128, **opts) as llm:
        # n-gram (n = 1) proposals need the generated token in the context: prompts of many tokens
        outs = llm.generate([list(range(1, 33)), "one two", list(range(100, 132))], [greedy, sampled, greedy_lp])
        replays = llm._worker.engine.runner.backend.graph_replays if device == "cuda" else 0  # type: ignore[union-attr]
        proposed = llm.metrics().get("spec_proposed_tokens", 0.0)
    return [(list(o.outputs[0].token_ids), o.outputs[0].logprobs) for o in outs], replays, proposed


def test_greedy_sampled_and_logprob_rows_in_replayed_verification_steps(tmp_path: Path) -> None:
    """n-gram speculation on: decode and verification steps (greedy rows argmax-only, sampled
    and logprob rows whole) replayed, against eager steps and the CPU."""
    path = write_tiny_llama(tmp_path, qtype="Q8_0", **SHAPE)
    spec = {"method": "ngram", "k": 2, "n": 1}
    graph, replays, proposed = _generate(path, "cuda", speculative=spec)
    eager, none, _ = _generate(path, "cuda", speculative=spec, enforce_eager=True)
    cpu, _, _ = _generate(path, "cpu")
    assert replays >= 3 and none == 0 and proposed > 0
    assert graph == eager  # tokens and logprobs, bit for bit
    for i in (0, 2):  # greedy rows (lossless speculation; argmax on the device) are the CPU's tokens
        assert graph[i][0] == cpu[i][0]
    for a, b in zip(graph[2][1], cpu[2][1]):
        assert a.keys() == b.keys()
        assert all(abs(a[k] - b[k]) < 1e-3 for k in a)
