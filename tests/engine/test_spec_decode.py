"""Speculative decoding: greedy output identical to plain decoding (n-gram and draft proposers,
k = 1..8, batched), the rejection-sampling rule preserves the target distribution (chi-square,
with a broken rule as the negative control), and option validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy_free_stats import chi_square_p_value

from edge_infer import LLM, SamplingParams
from edge_infer.config import EngineConfig, SpecConfig
from edge_infer.engine.ngram import NgramProposer
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.spec_decode import verify
from edge_infer.errors import InvalidRequest

# Prompts with repeats, so n-gram lookup has something to find.
PROMPTS = [
    "abc abc abc abc abc",
    [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7],
    "the cat sat on the mat; the cat sat on the",
]


def _generate(path, prompts, spec=None, max_tokens=24, **params):  # type: ignore[no-untyped-def]
    with LLM(str(path), n_threads=1, kv_cache_memory="8MiB", speculative=spec) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **params))
        return [o.token_ids for o in outs], llm.metrics()


@pytest.mark.parametrize("k", [1, 2, 4, 8, "auto"])
def test_ngram_greedy_identical(tiny_q8_path, k) -> None:  # type: ignore[no-untyped-def]
    plain, _ = _generate(tiny_q8_path, PROMPTS)
    spec, m = _generate(tiny_q8_path, PROMPTS, {"method": "ngram", "k": k})
    assert spec == plain
    assert m["spec_proposed_tokens"] > 0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_draft_model_greedy_identical(tiny_llama_path, tiny_q8_path, k) -> None:  # type: ignore[no-untyped-def]
    plain, _ = _generate(tiny_llama_path, PROMPTS)
    spec, m = _generate(tiny_llama_path, PROMPTS, {"method": "draft", "model": str(tiny_q8_path), "k": k})
    assert spec == plain
    # a Q8_0 copy of the same weights agrees with the F32 target almost always
    assert m["spec_acceptance_rate"] > 0.5


def test_draft_with_other_vocabulary_is_refused(tiny_llama_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tiny_llama_path.read_bytes()
    assert data.count(b"<|im_end|>") >= 1
    other = tmp_path / "other.gguf"
    other.write_bytes(data.replace(b"<|im_end|>", b"<|im_enx|>"))  # same length: still a valid file
    with pytest.raises(InvalidRequest, match="vocabular"):
        LLM(str(tiny_llama_path), kv_cache_memory="8MiB", speculative={"method": "draft", "model": str(other)})


@pytest.mark.parametrize(("spec", "msg"), [
    ({"method": "magic"}, "method"),
    ({"method": "ngram", "k": 0}, "k"),
    ({"method": "ngram", "k": "lots"}, "k"),
    ({"method": "draft"}, "model"),
    ({"method": "ngram", "depth": 3}, "depth"),
])
def test_bad_options(spec, msg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest, match=msg):
        SpecConfig.from_dict(spec)


def test_bad_option_fails_before_the_model_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The engine config validates `speculative` itself: no file is opened, even a missing one."""
    missing = str(tmp_path / "not-there.gguf")
    with pytest.raises(InvalidRequest, match="depth"):
        EngineConfig(model=missing, speculative={"method": "ngram", "depth": 3})
    with pytest.raises(InvalidRequest, match="k must be"):
        LLM(missing, speculative={"method": "ngram", "k": 99})
    cfg = EngineConfig(model=missing, speculative={"method": "ngram", "k": "auto"})
    assert cfg.speculative == SpecConfig("ngram", "auto", 8, 3, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.speculative.k = 2  # type: ignore[union-attr, misc]


def test_ngram_proposer_finds_latest_match() -> None:
    seq = Sequence("r", [1, 2, 3, 9, 1, 2, 3, 7, 1, 2], SamplingParams())
    prop = NgramProposer(3)
    assert prop.propose([(seq, 4)]) == {seq.seq_id: ([3, 7, 1, 2], [None] * 4)}
    seq2 = Sequence("r", [4, 5, 6], SamplingParams())
    assert prop.propose([(seq2, 4)]) == {seq2.seq_id: ([], [])}
    prop.release(seq)
    assert seq.seq_id not in prop.indexes


# -- the acceptance rule -------------------------------------------------------------------------

V = 6
P = np.array([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])  # target
Q = np.array([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])  # draft (deliberately different)


def _first_token_samples(n: int, broken: bool) -> np.ndarray:
    rng = np.random.default_rng(1234)
    logits = np.zeros((2, V))

    def target(row, accepted):  # type: ignore[no-untyped-def]
        return None, P

    counts = np.zeros(V, np.int64)
    for _ in range(n):
        x = int(rng.choice(V, p=Q))
        if broken:  # wrong rule: accept every proposal
            counts[x] += 1
            continue
        res = verify(rng, logits, [x], [Q], target)
        counts[res.tokens[0]] += 1
    return counts


def test_rejection_sampling_preserves_target_distribution() -> None:
    n = 20000
    good = _first_token_samples(n, broken=False)
    assert chi_square_p_value(good, P * n) > 1e-3
    bad = _first_token_samples(n, broken=True)
    assert chi_square_p_value(bad, P * n) < 1e-6


def test_rejection_sampling_with_deterministic_proposal() -> None:
    """n-gram proposals are one-hot q: accept with p(x), else draw from p without x."""
    rng = np.random.default_rng(7)
    n, x = 20000, 2
    counts = np.zeros(V, np.int64)
    for _ in range(n):
        res = verify(rng, np.zeros((2, V)), [x], [None], lambda row, acc: (None, P))
        counts[res.tokens[0]] += 1
    assert chi_square_p_value(counts, P * n) > 1e-3
