"""LLMEngine and LLM end to end on tiny random GGUF models (tests/support/tiny_models.py): batch
invariance under batching, late joins, chunking, preemption and threads; aborts; n > 1; stop
conditions; seeds; request validation; prompt_logits against the logits generation used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tiny_models import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    VOCAB_SIZE,
    write_tiny_gemma3,
    write_tiny_llama,
    write_tiny_qwen2,
)

from edge_infer import LLM, SamplingParams
from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine
from edge_infer.engine.model_runner import kv_block_bytes
from edge_infer.errors import InvalidRequest
from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models import config_from_gguf
from edge_infer.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "hello the world",
    "The quick brown fox jumps over the lazy cat, and then some more words follow here",
    "x",
    "ab" * 13,
]


def engine(path: Path, **options: Any) -> LLMEngine:
    opts: dict[str, Any] = {"n_threads": 1, "kv_cache_memory": "8MiB"}
    opts.update(options)
    return LLMEngine(EngineConfig.from_options(str(path), **opts))


def tiny_pool_engine(path: Path, num_blocks: int, block_size: int = 4, **options: Any) -> LLMEngine:
    """An engine whose KV pool holds exactly num_blocks blocks."""
    with GGUFFile(path) as f:
        per_block = kv_block_bytes(CpuBackend, config_from_gguf(f), block_size, "f16")
    return engine(path, kv_cache_memory=num_blocks * per_block, block_size=block_size, **options)


def run(
    eng: LLMEngine,
    requests: dict[str, tuple[Any, SamplingParams]],
    later: dict[int, dict[str, tuple[Any, SamplingParams]]] | None = None,
    aborts: dict[int, list[str]] | None = None,
    max_steps: int = 2000,
) -> dict[str, RequestOutput]:
    """Add `requests`, then step until done; `later[k]` joins before step k, `aborts[k]` are
    aborted before step k. Returns the final output of each request that finished."""
    later, aborts = later or {}, aborts or {}
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, prompt, params)
    done: dict[str, RequestOutput] = {}
    for k in range(max_steps):
        for rid, (prompt, params) in later.get(k, {}).items():
            eng.add_request(rid, prompt, params)
        for rid in aborts.get(k, []):
            assert eng.abort(rid)
        if not eng.has_unfinished_requests() and k >= max(later, default=0) and k >= max(aborts, default=0):
            return done
        for out in eng.step():
            assert out.request_id not in done, "no output after the final one"
            if out.finished:
                done[out.request_id] = out
    raise AssertionError("engine did not finish")


def alone(path: Path, prompt: Any, params: SamplingParams = GREEDY) -> RequestOutput:
    eng = engine(path, enable_prefix_caching=False)
    return run(eng, {"a": (prompt, params)})["a"]


MODELS = ["tiny_llama_path", "tiny_q8_path", "tiny_qwen2_path", "tiny_gemma3_path"]


@pytest.fixture(params=MODELS)
def model(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def baselines(request: pytest.FixtureRequest) -> dict[str, list[list[int]]]:
    """Greedy tokens of each prompt run alone in a fresh engine, per model."""
    out = {}
    for name in MODELS:
        path = request.getfixturevalue(name)
        out[name] = [alone(path, p).outputs[0].token_ids for p in PROMPTS]
    return out


def _tokens(outs: dict[str, RequestOutput]) -> list[list[int]]:
    return [outs[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))]


# -- batch invariance ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_greedy_batch_invariance(
    name: str, baselines: dict[str, list[list[int]]], request: pytest.FixtureRequest
) -> None:
    path = request.getfixturevalue(name)
    want = baselines[name]
    assert all(len(t) == 24 for t in want) and len({tuple(t) for t in want}) == len(PROMPTS)
    reqs = {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)}
    # all at once (with prefix caching: the two fox prompts share blocks)
    assert _tokens(run(engine(path), reqs)) == want
    # joining mid-flight
    items = list(reqs.items())
    later = {3: dict(items[1:3]), 7: dict(items[3:])}
    eng = engine(path)
    assert _tokens(run(eng, dict(items[:1]), later=later)) == want
    assert eng.metrics()["prefix_cache_hit_rate"] > 0  # the second fox prompt reused blocks
    # chunked prefill with a tiny budget
    assert _tokens(run(engine(path, max_num_batched_tokens=5), reqs)) == want


# Two real threads in a process of their own: under xdist the suite's workers start numba with one
# (tests/conftest.py), and an engine asked for two there gets one.
_TWO_THREADS = """
import json, sys
from edge_infer import LLM, SamplingParams
with LLM(sys.argv[1], n_threads=2, kv_cache_memory="8MiB", max_num_batched_tokens=8) as llm:
    assert llm.plan.n_threads == 2, llm.plan.n_threads
    outs = llm.generate(sys.argv[2:], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    print(json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


def test_greedy_thread_count_invariance(tiny_q8_path: Path, baselines: dict[str, list[list[int]]]) -> None:
    # short: every parallel kernel launch is slow on a busy machine
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", _TWO_THREADS, str(tiny_q8_path), *PROMPTS[:2]], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == [t[:12] for t in baselines["tiny_q8_path"][:2]]


VARIANTS = {
    "llama-q4_1": (write_tiny_llama, {"qtype": "Q4_1"}),
    "llama-f16-tied": (write_tiny_llama, {"qtype": "F16", "tied": True}),
    "llama-q4_k": (write_tiny_llama, {"qtype": "Q4_K", "d_model": 256, "ffn": 256}),
    "qwen2-q6_k": (write_tiny_qwen2, {"qtype": "Q6_K", "d_model": 256, "ffn": 512, "n_kv_heads": 4}),
    "gemma3-q8_0-6-layers": (write_tiny_gemma3, {"qtype": "Q8_0", "n_layers": 6, "swa_pattern": None}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tiny_variants_run_batch_invariant(variant: str, tmp_path: Path) -> None:
    write, kw = VARIANTS[variant]
    path = write(tmp_path, **kw)
    want = [alone(path, p).outputs[0].token_ids for p in PROMPTS[:3]]
    assert len({tuple(t) for t in want}) == 3
    got = run(
        engine(path, max_num_batched_tokens=7), {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS[:3])}
    )
    assert [got[str(i)].outputs[0].token_ids for i in range(3)] == want


def test_greedy_invariant_under_preemption(
    tiny_llama_path: Path, baselines: dict[str, list[list[int]]]
) -> None:
    # the longest request needs 84 / 4 = 21 blocks; all five together about 80
    eng = tiny_pool_engine(tiny_llama_path, num_blocks=24, max_num_seqs=5)
    reqs = {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)}
    got = run(eng, reqs)
    assert eng.scheduler.num_preemptions > 0
    assert _tokens(got) == baselines["tiny_llama_path"]
    assert eng.block_manager.num_used_blocks == 0


def test_seeded_sampling_reproducible_and_batch_invariant(tiny_llama_path: Path) -> None:
    p = SamplingParams(temperature=1.0, top_k=40, top_p=0.95, seed=123, max_tokens=16, ignore_eos=True)
    first = alone(tiny_llama_path, PROMPTS[1], p).outputs[0].token_ids
    assert alone(tiny_llama_path, PROMPTS[1], p).outputs[0].token_ids == first
    others = {str(i): (q, GREEDY) for i, q in enumerate(PROMPTS)}
    batched = run(engine(tiny_llama_path), {**others, "s": (PROMPTS[1], p)})
    assert batched["s"].outputs[0].token_ids == first
    reseeded = alone(
        tiny_llama_path,
        PROMPTS[1],
        SamplingParams(temperature=1.0, top_k=40, top_p=0.95, seed=124, max_tokens=16, ignore_eos=True),
    )
    assert reseeded.outputs[0].token_ids != first
    assert first != batched["1"].outputs[0].token_ids  # it really sampled


# -- aborts, n > 1 ------------------------------------------------------------------------------
def test_abort_frees_blocks(tiny_llama_path: Path, baselines: dict[str, list[list[int]]]) -> None:
    eng = engine(tiny_llama_path, max_num_seqs=2)
    reqs = {str(i): (p, GREEDY) for i, p in enumerate(PROMPTS)}
    got = run(eng, reqs, aborts={3: ["0", "4"]})  # 0 is running, 4 still waiting
    assert sorted(got) == ["1", "2", "3"]
    for i in (1, 2, 3):
        assert got[str(i)].outputs[0].token_ids == baselines["tiny_llama_path"][i]
    assert eng.block_manager.num_used_blocks == 0
    assert not eng.scheduler.running and not eng.scheduler.waiting
    assert not eng.abort("0") and not eng.abort("1") and not eng.abort("nope")  # gone already
    assert eng.stats["aborted"] == 2


def test_abort_everything_midway(tiny_q8_path: Path) -> None:
    eng = engine(tiny_q8_path)
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, GREEDY)
    for _ in range(4):
        eng.step()
    assert eng.block_manager.num_used_blocks > 0
    for i in range(len(PROMPTS)):
        assert eng.abort(str(i))
    assert eng.block_manager.num_used_blocks == 0 and not eng.has_unfinished_requests()
    assert eng.step() == []


def test_n_samples_share_prompt_blocks(tiny_llama_path: Path) -> None:
    eng = engine(tiny_llama_path, block_size=4)
    prompt = PROMPTS[2]
    p = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=10, ignore_eos=True)
    eng.add_request("r", prompt, p)
    n_prompt = len(eng.requests["r"].prompt_token_ids)
    eng.step()  # the prefill: the samples are forked from the leader here
    seqs = eng.requests["r"].seqs
    assert all(s in eng.scheduler.running for s in seqs)
    full = n_prompt // 4
    tables = [s.block_table[:full] for s in seqs]
    assert tables[0] == tables[1] == tables[2]
    assert all(eng.block_manager.blocks[b].ref_count == 3 for b in tables[0])
    done = run(eng, {})
    outs = done["r"].outputs
    assert [o.index for o in outs] == [0, 1, 2]
    assert all(len(o.token_ids) == 10 and o.finish_reason == "length" for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) > 1  # independent samples
    assert eng.block_manager.num_used_blocks == 0
    again = run(engine(tiny_llama_path), {"r": (prompt, p)})["r"].outputs
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]  # seeded: reproducible
    greedy = run(engine(tiny_llama_path), {"g": (prompt, SamplingParams(n=2, temperature=0, max_tokens=8))})
    a, b = greedy["g"].outputs
    assert a.token_ids == b.token_ids


# -- stop conditions ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stop_base(tiny_llama_path: Path) -> tuple[list[int], str]:
    out = alone(tiny_llama_path, "abc", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    return out.outputs[0].token_ids, out.outputs[0].text


def test_max_tokens(tiny_llama_path: Path, stop_base: tuple[list[int], str]) -> None:
    o = alone(tiny_llama_path, "abc", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)).outputs[0]
    assert o.token_ids == stop_base[0][:5] and o.finish_reason == "length" and o.stop_reason is None


def test_stop_token_ids(tiny_llama_path: Path, stop_base: tuple[list[int], str]) -> None:
    toks = stop_base[0]
    k = next(i for i in range(3, len(toks)) if toks[i] not in toks[:i])
    o = alone(
        tiny_llama_path, "abc", SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[toks[k]])
    ).outputs[0]
    assert o.token_ids == toks[: k + 1] and o.finish_reason == "stop" and o.stop_reason == toks[k]
    upto = alone(
        tiny_llama_path, "abc", SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)
    ).outputs[0]
    assert o.text == upto.text  # the stop token is in token_ids, not in the text
    # min_tokens holds it back: masked until enough tokens were generated
    o = alone(
        tiny_llama_path,
        "abc",
        SamplingParams(
            temperature=0,
            max_tokens=30,
            stop_token_ids=[toks[k]],
            min_tokens=k + 2,
            logit_bias={toks[k]: 100.0},
        ),
    ).outputs[0]
    assert len(o.token_ids) == k + 3 and o.token_ids[-1] == toks[k] and toks[k] not in o.token_ids[:-1]


def test_stop_strings(tiny_llama_path: Path, stop_base: tuple[list[int], str]) -> None:
    text = stop_base[1]
    i = next(j for j in range(2, len(text) - 1) if text[j : j + 2].isascii() and text[j : j + 2].isalpha())
    stop = text[i : i + 2]
    cut = text.index(stop)
    base = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop, "never-there"])
    o = alone(tiny_llama_path, "abc", base).outputs[0]
    assert (o.text, o.finish_reason, o.stop_reason) == (text[:cut], "stop", stop)
    assert o.token_ids == stop_base[0][: len(o.token_ids)] and len(o.token_ids) < 30
    inc = SamplingParams(
        temperature=0, max_tokens=30, ignore_eos=True, stop=stop, include_stop_str_in_output=True
    )
    o2 = alone(tiny_llama_path, "abc", inc).outputs[0]
    assert o2.text == text[: cut + len(stop)] and o2.token_ids == o.token_ids


def test_eos_ignore_eos_min_tokens(tiny_llama_path: Path) -> None:
    force_eos = {ENDOFTEXT: 100.0}
    o = alone(tiny_llama_path, "abc", SamplingParams(temperature=0, logit_bias=force_eos)).outputs[0]
    assert (o.token_ids, o.finish_reason, o.stop_reason, o.text) == ([ENDOFTEXT], "stop", None, "")
    o = alone(tiny_llama_path, "abc", SamplingParams(temperature=0, logit_bias={IM_END: 100.0})).outputs[0]
    assert (o.token_ids, o.finish_reason) == ([IM_END], "stop")  # every end-of-generation token stops
    p = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias=force_eos)
    o = alone(tiny_llama_path, "abc", p).outputs[0]
    assert (o.token_ids, o.finish_reason, o.text) == ([ENDOFTEXT] * 6, "length", "")
    p = SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, logit_bias=force_eos, skip_special_tokens=False
    )
    assert alone(tiny_llama_path, "abc", p).outputs[0].text == "<|endoftext|>" * 6
    p = SamplingParams(temperature=0, max_tokens=20, min_tokens=3, logit_bias=force_eos)
    o = alone(tiny_llama_path, "abc", p).outputs[0]
    assert len(o.token_ids) == 4 and o.token_ids[3] == ENDOFTEXT and ENDOFTEXT not in o.token_ids[:3]
    assert o.finish_reason == "stop"


# -- validation ---------------------------------------------------------------------------------
def test_prompt_too_long(tiny_llama_path: Path) -> None:
    eng = engine(tiny_llama_path, max_model_len=32)
    with pytest.raises(InvalidRequest, match="context length"):
        eng.add_request("a", list(range(40)), SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequest, match="max_tokens"):
        eng.add_request("b", list(range(20)), SamplingParams(max_tokens=20))
    eng.add_request("c", list(range(20)), SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    got = run(eng, {})["c"].outputs[0]
    assert len(got.token_ids) == 12
    # max_tokens=None: up to the context length
    out = run(eng, {"d": (list(range(20)), SamplingParams(max_tokens=None, temperature=0, ignore_eos=True))})
    assert len(out["d"].outputs[0].token_ids) == 12 and out["d"].finish_reason == "length"


def test_bad_requests(tiny_llama_path: Path) -> None:
    eng = engine(tiny_llama_path)
    for bad in ([], [VOCAB_SIZE], [-1], [1.5], None, 42):
        with pytest.raises(InvalidRequest):
            eng.add_request("x", bad, GREEDY)  # type: ignore[arg-type]
    eng.add_request("dup", [1, 2], GREEDY)
    with pytest.raises(InvalidRequest, match="dup"):
        eng.add_request("dup", [1, 2], GREEDY)


def test_llm_options_and_generate(tiny_llama_path: Path, baselines: dict[str, list[list[int]]]) -> None:
    with pytest.raises(InvalidRequest) as e:
        LLM(str(tiny_llama_path), n_thread=1, kv_cache_memory="8MiB")
    assert "n_thread" in str(e.value)
    with pytest.raises(InvalidRequest, match="kv_cache_memory"):
        LLM(str(tiny_llama_path), kv_cache_memory="lots")
    with LLM(str(tiny_llama_path), n_threads=1, kv_cache_memory="8MiB") as llm:
        outs = llm.generate(PROMPTS, GREEDY)
        assert [o.prompt for o in outs] == PROMPTS
        assert [o.token_ids for o in outs] == baselines["tiny_llama_path"]
        with pytest.raises(InvalidRequest, match="context length"):
            llm.generate([1] * 1000, GREEDY)
        text = "".join(llm.stream(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)))
        assert (
            text
            == llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].text
        )
        ids = llm.chat_prompt([{"role": "user", "content": "hi <|im_end|>"}])
        assert ids.count(IM_START) == 2 and ids.count(IM_END) == 1  # message text stays text
        (reply,) = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=4))
        assert reply.finished and 1 <= len(reply.token_ids) <= 4
        assert llm.metrics()["kv_blocks_used"] == 0


# -- prompt_logits ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny_llama_path", "tiny_gemma3_path"])
@pytest.mark.parametrize("chunk", [256, 3])
def test_prompt_logits_equal_generation_logits(name: str, chunk: int, request: pytest.FixtureRequest) -> None:
    """Row i of the teacher-forced logits is bit-identical to the logits the decode step that
    produced token i + 1 saw (prefill vs decode, any chunking)."""
    path = request.getfixturevalue(name)
    eng = engine(path, max_num_batched_tokens=chunk)
    seen: list[np.ndarray] = []
    execute = eng.runner.execute

    def spy(sched, whole):  # type: ignore[no-untyped-def]
        logits = execute(sched, whole | True)  # every row on the host, to compare them
        rows = [c.seq for c in sched.chunks for _ in c.logit_indices]
        seen.extend(logits.row(i).copy() for i, s in enumerate(rows) if s.request_id == "a")
        return logits

    eng.runner.execute = spy  # type: ignore[method-assign]
    prompt = PROMPTS[2]
    out = run(eng, {"a": (prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))})["a"]
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    n = len(out.prompt_token_ids)
    logits = eng.score(ids[:-1])
    assert logits.shape == (len(ids) - 1, VOCAB_SIZE) and logits.dtype == np.float32
    assert len(seen) == 12
    for j, row in enumerate(seen):
        assert np.array_equal(logits[n - 1 + j], row), j
    assert [int(np.argmax(r)) for r in logits[n - 1 :]] == out.outputs[0].token_ids
    assert eng.block_manager.num_used_blocks == 0


def test_llm_prompt_logits(tiny_qwen2_path: Path) -> None:
    with LLM(str(tiny_qwen2_path), n_threads=1, kv_cache_memory="8MiB", max_num_batched_tokens=7) as llm:
        ids = llm.tokenizer.encode(PROMPTS[0])
        a = llm.prompt_logits(ids)
        b = llm.prompt_logits(ids[:10])  # a prefix: the same rows (and a prefix-cache-free path)
        assert a.shape == (len(ids), VOCAB_SIZE)
        assert np.array_equal(a[:10], b)
        assert np.all(np.isfinite(a))
