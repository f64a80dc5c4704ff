"""Speculative decoding on real models: greedy output is token for token the plain greedy output.

- n-gram prompt lookup on qwen2.5-coder-0.5b, with an input-grounded task (rewrite a given
  function with one change) batched with other prompts, at k = 1 and 8 and at "auto";
- a draft model: the target is an F16 copy of smollm2-135m (made once, benchmarks/make_f16_copy.py),
  the draft the original low-bit file; the two agree on nearly every token.

n_threads=1, as in test_batching_real.py: robust on a shared machine, and results do not depend
on the thread count.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_infer import LLM, SamplingParams

# The benchmark's task and F16 writer (benchmarks/ is not a package): one definition of each.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_spec import CODE_TASK  # noqa: E402
from make_f16_copy import write_copy  # noqa: E402

sys.path.pop(0)

pytestmark = pytest.mark.slow

THREADS = 1
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)

OTHER_PROMPTS = ["def is_prime(n):", "The three primary colors are"]
Prompts = list[str | list[int]]
DRAFT_PROMPTS: Prompts = [
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The history of the Roman Empire",
]


def generate(model: Path, prompts: Prompts, speculative: dict[str, Any] | None = None
             ) -> tuple[list[list[int]], dict[str, float]]:
    with LLM(str(model), n_threads=THREADS, kv_cache_memory="64MiB", speculative=speculative) as llm:
        outs = llm.generate(prompts, GREEDY)
        return [o.token_ids for o in outs], llm.metrics()


def assert_same(got: list[list[int]], want: list[list[int]], what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            k = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), min(len(g), len(w)))
            pytest.fail(f"{what}: prompt {i} differs from plain greedy at output token {k}: {g[k:k + 6]} vs {w[k:k + 6]}")


# -- n-gram -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_plain(qwen2_path: Path) -> tuple[Prompts, list[list[int]]]:
    """The prompts (the code task in the model's chat template, then OTHER_PROMPTS as text) and
    their plain greedy outputs, generated together."""
    with LLM(str(qwen2_path), n_threads=THREADS, kv_cache_memory="64MiB") as llm:
        prompts: Prompts = [llm.chat_prompt([{"role": "user", "content": CODE_TASK}]), *OTHER_PROMPTS]
        outs = llm.generate(prompts, GREEDY)
    assert outs[0].finish_reason == "length"  # the rewrite is longer than max_tokens
    return prompts, [o.token_ids for o in outs]


@pytest.mark.parametrize("k", [1, 8, "auto"])  # the shortest proposal, a long one, the adaptive one
def test_ngram_greedy_equals_plain(qwen2_path: Path, qwen_plain: tuple[Prompts, list[list[int]]],
                                   k: int | str) -> None:
    prompts, plain = qwen_plain
    ids, m = generate(qwen2_path, prompts, {"method": "ngram", "k": k})
    assert_same(ids, plain, f"ngram k={k}")
    # the rewrite copies its prompt: lookups are proposed and (some) accepted
    assert m["spec_proposed_tokens"] > 0 and m["spec_accepted_tokens"] > 0, m
    assert m["spec_tokens_per_step"] > 1.0, m


# -- draft model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def f16_target(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An F16 copy of smollm2 (about 270 MB, a few seconds to write), deleted after the module."""
    path = write_copy(str(smollm2_path), str(tmp_path_factory.mktemp("f16") / "smollm2-135m-f16.gguf"), "F16")
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def f16_plain(f16_target: Path) -> list[list[int]]:
    ids, _ = generate(f16_target, DRAFT_PROMPTS)
    return ids


@pytest.mark.parametrize("k", [2, 5])
def test_draft_greedy_equals_plain(f16_target: Path, f16_plain: list[list[int]], smollm2_path: Path,
                                   k: int) -> None:
    ids, m = generate(f16_target, DRAFT_PROMPTS, {"method": "draft", "model": str(smollm2_path), "k": k})
    assert_same(ids, f16_plain, f"draft k={k}")
    assert m["spec_proposed_tokens"] > 0, m
    assert m["spec_acceptance_rate"] > 0.8, m
