"""Batch invariance on the real smollm2 model: greedy token ids are the same alone, batched,
joining mid-flight, under preemption (a tiny KV pool), next to aborted requests, and with the
prompt prefilled in several chunks.

The "alone" references are computed once, one request at a time. Each comparison on the main
engine starts from an empty prefix cache so that the batched prefill is really computed (the
preemption test, on its own engine, exercises prefix hits: a preempted sequence recomputes
through the cache).

n_threads=1: the machines that run these tests are often shared, and a 2-thread numba kernel
loses far more to an oversubscribed core than it gains on a quiet one. Results do not depend
on the thread count (see DESIGN.md, batch invariance).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_infer import LLM, SamplingParams
from edge_infer.engine.worker import RequestHandle
from edge_infer.errors import EdgeInferError
from edge_infer.outputs import RequestOutput

pytestmark = pytest.mark.slow

THREADS = 1
MAX_TOKENS = 32
# ignore_eos: every request runs its full MAX_TOKENS, so the KV sizing below is exact
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PROMPTS = [  # 5, 18, 19, 23, 28 and 54 tokens with BOS
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Here is a list of the planets of the solar system, in order of their distance from the Sun: Mercury,",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to "
    "synthesize foods from carbon dioxide and water. In plants, it",
    "The history of the Roman Empire spans many centuries. It began when Augustus became the first "
    "emperor in 27 BC, after the fall of the Republic, and it lasted in the west until 476 AD, when "
    "the last emperor was deposed. Among its",
]
TIGHT_BLOCKS = 20  # 6 requests need 25 blocks of 16 tokens at their longest: preemption is forced
TIGHT_BUDGET = 64  # tokens per step on the tight engine: the long prompt takes 5 chunks
LONG_MAX_TOKENS = 24


def long_prompt() -> str:
    """About 265 tokens of varied prose (prompt + LONG_MAX_TOKENS fits the tight pool alone)."""
    parts = [
        "In the spring of that year the river rose higher than anyone in the valley could remember.",
        "The miller, whose family had worked the same stones for four generations, moved his sacks of "
        "flour to the loft and waited.",
        "His daughter kept a ledger of every boat that passed, noting the cargo, the name of the "
        "captain and the hour, because her grandfather had taught her that a valley's fortunes can "
        "be read in its traffic.",
        "By the third week the ledger showed salt from the coast, timber from the northern forests, "
        "wool, iron tools, barrels of cider and, once, a cage of parrots bound for the duke's garden.",
        "The schoolmaster came down to the mill each evening to argue about the weather with the "
        "miller, and each evening they agreed on nothing except that the water would fall when it "
        "chose to.",
        "When at last it did, the fields were covered in a fine grey silt that the farmers said "
        "would make the best harvest in a decade, and they were right: the barley stood so tall "
        "that children could hide in it, and the orchards bent under their fruit.",
        "The duke's steward, who had lost two of the parrots to a fox on the road, never came that way again.",
        "Years later, when the daughter had become the miller herself, she opened the old ledger and read",
    ]
    return " ".join(parts)


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> Iterator[LLM]:
    with LLM(str(smollm2_path), n_threads=THREADS, kv_cache_memory="64MiB", max_num_batched_tokens=512) as m:
        yield m


@pytest.fixture(scope="module")
def alone(llm: LLM) -> list[list[int]]:
    """Greedy token ids of each prompt generated on its own."""
    refs = []
    for p in PROMPTS:
        clear_prefix_cache(llm)
        (out,) = llm.generate(p, GREEDY)
        assert out.finish_reason == "length" and len(out.token_ids) == MAX_TOKENS
        refs.append(out.token_ids)
    return refs


@pytest.fixture(scope="module")
def tight(llm: LLM, smollm2_path: Path) -> Iterator[LLM]:
    """An engine whose KV pool holds TIGHT_BLOCKS blocks, sized from the model's block bytes
    (368,640 bytes per 16-token f16 block for smollm2), and a 64-token step budget."""
    per_block = llm.plan.kv_cache_bytes // llm.plan.num_kv_blocks
    with LLM(str(smollm2_path), n_threads=THREADS, kv_cache_memory=TIGHT_BLOCKS * per_block,
             max_num_batched_tokens=TIGHT_BUDGET) as m:
        assert m.plan.num_kv_blocks == TIGHT_BLOCKS
        yield m


def clear_prefix_cache(llm: LLM) -> None:
    llm.worker.call(lambda e: e.block_manager.reset_prefix_cache())


def assert_same(got: list[list[int]], want: list[list[int]], what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            k = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
            pytest.fail(f"{what}: prompt {i} differs from its alone run at output token {k}: {g[k:k + 6]} vs {w[k:k + 6]}")


def wait(handle: RequestHandle) -> RequestOutput:
    while True:
        out = handle.get(timeout=300)
        if out.finished:
            return out


def assert_idle(llm: LLM) -> None:
    m = llm.metrics()
    assert (m["running"], m["waiting"], m["kv_blocks_used"]) == (0, 0, 0), m


# -- (a) one batch -----------------------------------------------------------------------------
def test_batched_equals_alone(llm: LLM, alone: list[list[int]]) -> None:
    clear_prefix_cache(llm)
    outs = llm.generate(PROMPTS, GREEDY)
    assert_same([o.token_ids for o in outs], alone, "batched")
    assert_idle(llm)


# -- (b) requests joining mid-flight -----------------------------------------------------------
def test_requests_joining_mid_flight_equal_alone(llm: LLM, alone: list[list[int]]) -> None:
    clear_prefix_cache(llm)
    early = [llm.worker.submit(p, GREEDY) for p in PROMPTS[:3]]
    first = early[0].get()
    while len(first.token_ids) < 3:  # the first three are decoding...
        first = early[0].get()
    assert not first.finished
    late = [llm.worker.submit(p, GREEDY) for p in PROMPTS[3:]]  # ...when the others arrive
    outs = [wait(h) for h in early + late]
    assert_same([o.token_ids for o in outs], alone, "joining mid-flight")
    # the late requests really shared steps with the early ones
    assert outs[3].metrics is not None and outs[0].metrics is not None
    assert outs[3].metrics.first_token_time < outs[0].metrics.finished_time  # type: ignore[operator]
    assert_idle(llm)


# -- (c) preemption ---------------------------------------------------------------------------------
def test_preemption_keeps_outputs(tight: LLM, alone: list[list[int]]) -> None:
    before = tight.metrics()["preemptions"]
    outs = tight.generate(PROMPTS, GREEDY)
    m = tight.metrics()
    assert m["preemptions"] > before, m
    assert_same([o.token_ids for o in outs], alone, "under preemption")
    assert_idle(tight)


# -- (d) aborts --------------------------------------------------------------------------------
def test_aborts_do_not_change_the_others(llm: LLM, alone: list[list[int]]) -> None:
    clear_prefix_cache(llm)
    handles = [llm.worker.submit(p, GREEDY) for p in PROMPTS]
    doomed = {1, 4}
    partial = handles[1].get()
    while len(partial.token_ids) < 3:
        partial = handles[1].get()
    for i in sorted(doomed):
        llm.worker.abort(handles[i].request_id)
    kept = [i for i in range(len(PROMPTS)) if i not in doomed]
    outs = {i: wait(handles[i]) for i in kept}
    assert_same([outs[i].token_ids for i in kept], [alone[i] for i in kept], "next to aborted requests")
    for i in sorted(doomed):  # an aborted request ends with an error, its tokens a prefix of the alone run
        last = None
        with pytest.raises(EdgeInferError, match="aborted"):
            while True:
                last = handles[i].get(timeout=300)
                assert not last.finished, f"request {i} finished before the abort reached it"
        if last is not None:
            assert last.token_ids == alone[i][: len(last.token_ids)]
    assert partial.token_ids == alone[1][: len(partial.token_ids)]
    assert llm.metrics()["aborted"] >= 2
    assert_idle(llm)


# -- (e) chunked prefill --------------------------------------------------------------------------
def test_chunked_prefill_equals_one_chunk(llm: LLM, tight: LLM) -> None:
    prompt = long_prompt()
    n = len(llm.tokenizer.encode(prompt, add_special=True, parse_special=False))
    assert 250 <= n <= TIGHT_BLOCKS * 16 - LONG_MAX_TOKENS, n
    params = SamplingParams(temperature=0.0, max_tokens=LONG_MAX_TOKENS, ignore_eos=True)
    clear_prefix_cache(llm)
    clear_prefix_cache(tight)
    (one,) = llm.generate(prompt, params)  # budget 512: one chunk
    steps = tight.metrics()["steps"]
    (chunked,) = tight.generate(prompt, params)  # budget 64: five chunks
    assert tight.metrics()["steps"] - steps == -(-n // TIGHT_BUDGET) + LONG_MAX_TOKENS - 1
    assert_same([chunked.token_ids], [one.token_ids], "chunked prefill")
    assert_idle(tight)
