"""Sampler: penalties, temperature, min-p/top-k/top-p, seeded draws and logprobs, checked against a
plain NumPy reference written here (one token at a time, no vector tricks shared with the code)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from edge_infer.engine.sampler import (
    draw,
    log_softmax,
    make_logits_processors,
    process_logits,
    sample_token,
    sampling_probs,
    stop_ids,
    top_logprobs,
)
from edge_infer.engine.sequence import Sequence
from edge_infer.sampling_params import SamplingParams

V = 12
EOS = 11


def make_seq(
    params: SamplingParams, prompt: list[int], output: list[int] = (), seed: int | None = None
) -> Sequence:  # type: ignore[assignment]
    s = Sequence("r", list(prompt), params)
    s.output_token_ids = list(output)
    s.logits_processors = make_logits_processors(params, stop_ids(params, (EOS,)), V)
    if seed is not None:
        s.rng = np.random.default_rng(seed)
    return s


# -- the reference -----------------------------------------------------------------------------
def ref_penalties(
    logits: np.ndarray, p: SamplingParams, prompt: list[int], output: list[int], stop_ids: list[int]
) -> list[float]:
    """vLLM's logits processing, written token by token in float64."""
    x = [float(v) for v in logits]
    for tok, b in (p.logit_bias or {}).items():
        if 0 <= tok < len(x):
            x[tok] += b
    if len(output) < p.min_tokens:
        for tok in stop_ids:
            x[tok] = -math.inf
    for tok in set(prompt) | set(output):
        if p.repetition_penalty != 1.0:
            x[tok] = x[tok] / p.repetition_penalty if x[tok] > 0 else x[tok] * p.repetition_penalty
    for tok in set(output):
        x[tok] -= p.frequency_penalty * output.count(tok) + p.presence_penalty
    return x


def ref_probs(x: list[float], p: SamplingParams) -> np.ndarray:
    """softmax(x / T), then drop tokens below min_p * max, outside the top k, outside the top-p
    nucleus (the tokens whose preceding mass, in descending order, is below top_p)."""
    m = max(x)
    w = [math.exp((v - m) / p.temperature) for v in x]
    total = sum(w)
    probs = [v / total for v in w]
    keep = [True] * len(x)
    if p.min_p > 0:
        keep = [k and q >= p.min_p * max(probs) for k, q in zip(keep, probs, strict=True)]
    if 0 < p.top_k < len(x):
        kth = sorted((q for q, k in zip(probs, keep, strict=True) if k), reverse=True)
        cut = kth[p.top_k - 1] if len(kth) >= p.top_k else 0.0
        keep = [k and q >= cut for k, q in zip(keep, probs, strict=True)]
    if p.top_p < 1.0:
        kept = sum(q for q, k in zip(probs, keep, strict=True) if k)
        order = sorted((i for i in range(len(x)) if keep[i]), key=lambda i: -probs[i])
        before = 0.0
        for i in order:
            if before >= p.top_p * kept:
                keep[i] = False
            before += probs[i]
    out = np.array([q if k else 0.0 for q, k in zip(probs, keep, strict=True)])
    return out / out.sum()


# -- penalties ---------------------------------------------------------------------------------
LOGITS = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, -0.5, 1.5, 2.5, -3.0, 4.0], np.float32)


def test_no_processing_is_identity() -> None:
    seq = make_seq(SamplingParams(), [1, 2], [3])
    assert seq.logits_processors == []  # nothing to apply: the logits are read as they are
    assert process_logits(LOGITS, seq) is LOGITS
    p = SamplingParams(repetition_penalty=1.1)
    x = process_logits(LOGITS, make_seq(p, [1, 2], [3]))
    assert x is not LOGITS and x.dtype == np.float32 and not np.array_equal(x, LOGITS)


def test_repetition_penalty_over_prompt_and_output() -> None:
    p = SamplingParams(repetition_penalty=2.0)
    x = process_logits(LOGITS, make_seq(p, [0, 1, 1], [3, 4]))
    want = LOGITS.copy()
    want[[0, 3]] /= 2  # positive: divided
    want[[1, 4]] *= 2  # negative: multiplied (so, further down)
    assert np.array_equal(x, want)


def test_frequency_and_presence_over_output_only() -> None:
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    x = process_logits(LOGITS, make_seq(p, [0, 0, 5], [3, 3, 3, 7]))
    want = LOGITS.copy()
    want[3] -= 3 * 0.5 + 0.25
    want[7] -= 1 * 0.5 + 0.25
    assert np.allclose(x, want, rtol=0, atol=1e-6)
    assert x[0] == LOGITS[0] and x[5] == LOGITS[5]  # prompt tokens untouched
    neg = process_logits(LOGITS, make_seq(SamplingParams(presence_penalty=-1.0), [], [2]))
    assert neg[2] == LOGITS[2] + 1.0  # negative penalties encourage


def test_logit_bias_and_out_of_range_ids_ignored() -> None:
    p = SamplingParams(logit_bias={2: 10.0, 4: -5.0, 999: 3.0})
    x = process_logits(LOGITS, make_seq(p, [1]))
    assert x[2] == LOGITS[2] + 10 and x[4] == LOGITS[4] - 5
    assert np.array_equal(np.delete(x, [2, 4]), np.delete(LOGITS, [2, 4]))


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[9])
    assert int(np.argmax(LOGITS)) == EOS
    for n_out, want in ((0, 3), (1, 3), (2, EOS)):  # 3 = best token once 11 and 9 are masked
        seq = make_seq(p, [0], [5] * n_out)
        x = process_logits(LOGITS, seq)
        masked = n_out < 2
        assert (x[EOS] == -np.inf) == masked and (x[9] == -np.inf) == masked
        assert sample_token(LOGITS, seq)[0] == want
    # ignore_eos: EOS is an ordinary token, so min_tokens does not mask it
    p2 = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)
    assert sample_token(LOGITS, make_seq(p2, [0]))[0] == EOS


@settings(max_examples=150, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=V, max_size=V),
    prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=6),
    output=st.lists(st.integers(0, V - 1), max_size=6),
    rep=st.sampled_from([1.0, 0.5, 1.3, 2.0]),
    freq=st.sampled_from([0.0, 0.5, -1.0, 2.0]),
    pres=st.sampled_from([0.0, 0.25, -0.5, 1.5]),
    bias=st.dictionaries(st.integers(0, V + 3), st.sampled_from([-5.0, 0.5, 3.0]), max_size=3),
    min_tokens=st.integers(0, 4),
    stop=st.lists(st.integers(0, V - 1), max_size=2),
)
def test_penalties_match_reference(
    logits: list[float],
    prompt: list[int],
    output: list[int],
    rep: float,
    freq: float,
    pres: float,
    bias: dict[int, float],
    min_tokens: int,
    stop: list[int],
) -> None:
    p = SamplingParams(
        repetition_penalty=rep,
        frequency_penalty=freq,
        presence_penalty=pres,
        logit_bias=bias,
        min_tokens=min_tokens,
        stop_token_ids=stop,
    )
    arr = np.array(logits, np.float32)
    got = process_logits(arr, make_seq(p, prompt, output))
    want = ref_penalties(arr, p, prompt, output, list(stop_ids(p, (EOS,))))
    assert got.dtype == np.float32
    assert np.allclose(got, want, rtol=1e-5, atol=1e-4)
    assert np.array_equal(np.isinf(got), np.isinf(want))


# -- the sampling distribution -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "support"),
    [
        ({}, set(range(V))),
        ({"top_k": 3}, {11, 3, 9}),
        ({"top_k": -1}, set(range(V))),
        ({"top_k": V}, set(range(V))),
        ({"top_k": 1}, {11}),
        ({"min_p": 0.2}, {11, 3, 9}),  # keeps x >= 4 + ln 0.2 = 2.39
        ({"min_p": 0.3}, {11, 3}),  # keeps x >= 4 + ln 0.3 = 2.80
        ({"min_p": 0.2, "top_k": 2}, {11, 3}),
        ({"top_k": 4, "top_p": 0.8}, {11, 3, 9}),  # top 4 masses: .58, .79, .92, 1
        ({"top_p": 1e-9}, {11}),  # the first token always stays
    ],
)
def test_filters_on_fixed_logits(kw: dict, support: set[int]) -> None:
    p = SamplingParams(**kw)
    probs = sampling_probs(LOGITS, p)
    assert {int(i) for i in np.flatnonzero(probs)} == support
    assert math.isclose(probs.sum(), 1.0, rel_tol=1e-12)
    assert np.allclose(probs, ref_probs(list(LOGITS), p), rtol=1e-9, atol=1e-12)


def test_exact_boundaries() -> None:
    """Masses that land exactly on the threshold (equal logits give exact quarters)."""
    flat = np.zeros(4, np.float32)
    for top_p, kept in ((0.25, 1), (0.5, 2), (0.75, 3), (0.76, 4)):  # a prefix reaching top_p exactly
        probs = sampling_probs(flat, SamplingParams(top_p=top_p))
        assert np.flatnonzero(probs).tolist() == list(range(kept)), top_p  # ties: lowest ids first
    # min_p = 1 keeps the most likely token(s) only: the threshold itself is kept
    assert np.flatnonzero(sampling_probs(LOGITS, SamplingParams(min_p=1.0))).tolist() == [11]
    assert np.flatnonzero(sampling_probs(flat, SamplingParams(min_p=1.0))).tolist() == [0, 1, 2, 3]


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    x = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    # masses in descending order: 0.4, 0.7, 0.9, 1.0 (top_p values stay clear of them)
    for top_p, support in (
        (0.39, {1}),
        (0.41, {1, 3}),
        (0.69, {1, 3}),
        (0.71, {1, 3, 2}),
        (0.95, {0, 1, 2, 3}),
    ):
        probs = sampling_probs(x, SamplingParams(top_p=top_p))
        assert {int(i) for i in np.flatnonzero(probs)} == support, top_p
        # the kept tokens keep their relative weights
        assert np.allclose(
            probs[list(support)],
            np.array([0.1, 0.4, 0.2, 0.3])[list(support)] / sum([0.1, 0.4, 0.2, 0.3][i] for i in support),
        )


@pytest.mark.parametrize("t", [0.25, 0.7, 1.0, 3.0])
def test_temperature_scales_logits(t: float) -> None:
    probs = sampling_probs(LOGITS, SamplingParams(temperature=t))
    z = np.exp((LOGITS.astype(np.float64) - LOGITS.max()) / t)
    assert np.allclose(probs, z / z.sum(), rtol=1e-12)


def _borderline(x: list[float], p: SamplingParams) -> bool:
    """Whether nudging top_p or min_p by a rounding-sized step changes the reference's support,
    or two different logits are close enough for rounding to tie them."""
    distinct = sorted(set(x))
    if any(b - a < 1e-3 for a, b in zip(distinct, distinct[1:], strict=False)):
        return True
    supports = set()
    for dp in (-1e-7, 1e-7):
        for dm in (-1e-9, 1e-9):
            q = dataclasses.replace(
                p,
                top_p=min(1.0, p.top_p + dp) if p.top_p < 1.0 else 1.0,
                min_p=max(0.0, p.min_p + dm) if p.min_p > 0 else 0.0,
            )
            supports.add(tuple(ref_probs(x, q) > 0))
    return len(supports) > 1


@settings(max_examples=200, deadline=None)
@given(
    # a grid of logits: exact ties happen (and must be treated alike), near-ties do not
    logits=st.lists(st.integers(-64, 64).map(lambda i: i / 8), min_size=V, max_size=V),
    temperature=st.sampled_from([0.3, 1.0, 1.7]),
    top_k=st.sampled_from([0, -1, 1, 2, 5, V - 1, V, 50]),
    top_p=st.sampled_from([1.0, 0.9, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.5]),
)
def test_sampling_probs_match_reference(
    logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float
) -> None:
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    x = [float(v) for v in np.array(logits, np.float32)]
    assume(not _borderline(x, p))
    got = sampling_probs(np.array(x, np.float32), p)
    want = ref_probs(x, p)
    assert np.array_equal(got > 0, want > 0)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-12)


# -- drawing -----------------------------------------------------------------------------------
PROBS = np.array([0.1, 0.0, 0.3, 0.05, 0.0, 0.25, 0.3, 0.0])


def test_draw_distribution() -> None:
    rng = np.random.default_rng(1234)
    n = 20_000
    counts = np.bincount([draw(PROBS, rng) for _ in range(n)], minlength=PROBS.size)
    assert counts[PROBS == 0].sum() == 0  # zero-probability tokens are never drawn
    live = PROBS > 0
    expected = PROBS[live] * n
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # 4 degrees of freedom: P(chi2 > 20.5) < 0.0005
    assert np.all(np.abs(counts / n - PROBS) < 5 * np.sqrt(PROBS * (1 - PROBS) / n) + 1e-12)


def test_draw_seeded_reproducible_and_seed_sensitive() -> None:
    a = [draw(PROBS, r) for r in [np.random.default_rng(7)] for _ in range(50)]
    b = [draw(PROBS, r) for r in [np.random.default_rng(7)] for _ in range(50)]
    c = [draw(PROBS, r) for r in [np.random.default_rng(8)] for _ in range(50)]
    assert a == b and a != c


def test_draw_unnormalised_and_single_token() -> None:
    rng = np.random.default_rng(0)
    assert {draw(PROBS * 3.0, rng) for _ in range(200)} <= {0, 2, 3, 5, 6}
    one = np.zeros(5)
    one[3] = 1.0
    assert {draw(one, rng) for _ in range(50)} == {3}


def test_sampler_seeded_rows_reproducible() -> None:
    p = SamplingParams(temperature=1.3, top_k=6, seed=5)

    def run(seed: int) -> list[int]:
        seq = make_seq(p, [0, 1], seed=seed)
        toks = []
        for _ in range(40):
            tok, _ = sample_token(LOGITS, seq)
            seq.output_token_ids.append(tok)
            toks.append(tok)
        return toks

    first = run(5)
    assert first == run(5)
    assert first != run(6)
    allowed = set(np.argsort(-LOGITS)[:6].tolist())
    assert set(first) <= allowed and len(set(first)) > 1


def test_sampler_distribution_end_to_end() -> None:
    """sample_token draws from sampling_probs(process_logits(...))."""
    p = SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.5, logit_bias={0: 1.0})
    seq = make_seq(p, [11, 3], seed=99)
    probs = sampling_probs(process_logits(LOGITS, seq), p)
    n = 20_000
    counts = np.bincount([sample_token(LOGITS, seq)[0] for _ in range(n)], minlength=V)
    assert counts[probs == 0].sum() == 0
    live = probs > 0
    chi2 = float(((counts[live] - probs[live] * n) ** 2 / (probs[live] * n)).sum())
    df = int(live.sum()) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df)


# -- greedy ------------------------------------------------------------------------------------
def test_greedy_is_argmax_after_penalties() -> None:
    assert sample_token(LOGITS, make_seq(SamplingParams(temperature=0), [0]))[0] == 11
    # 11 was seen: 4.0 / 2 = 2.0 falls below 3.0 (token 3), so greedy picks 3
    p = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample_token(LOGITS, make_seq(p, [11]))[0] == 3
    p = SamplingParams(temperature=0, repetition_penalty=2.0, logit_bias={3: -1.0})
    assert sample_token(LOGITS, make_seq(p, [11]))[0] == 9
    p = SamplingParams(temperature=0, logit_bias={4: 7.0})
    assert sample_token(LOGITS, make_seq(p, [0]))[0] == 4
    # greedy needs no generator and ignores top_k/top_p
    p = SamplingParams(temperature=0, top_k=1, top_p=0.1, frequency_penalty=2.0)
    seq = make_seq(p, [0], [11])
    assert seq.rng is None and sample_token(LOGITS, seq)[0] == 3


# -- logprobs ----------------------------------------------------------------------------------
def ref_logprobs(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - math.log(math.fsum(math.exp(v) for v in x))


def test_log_softmax() -> None:
    assert np.allclose(log_softmax(LOGITS), ref_logprobs(LOGITS), rtol=0, atol=1e-12)
    big = np.array([1000.0, 999.0, -1000.0], np.float32)  # no overflow
    assert np.allclose(np.exp(log_softmax(big)).sum(), 1.0)


@pytest.mark.parametrize("n", [0, 1, 3, 20])
def test_top_logprobs_include_chosen(n: int) -> None:
    ref = ref_logprobs(LOGITS)
    chosen = 10  # the least likely token
    lp = top_logprobs(LOGITS, chosen, n)
    top = list(np.argsort(-ref, kind="stable")[: min(n, V)])
    assert set(lp) == set(map(int, top)) | {chosen}
    for t, v in lp.items():
        assert math.isclose(v, ref[t], rel_tol=0, abs_tol=1e-12)


def test_sampler_logprobs_are_raw() -> None:
    """Logprobs come from the model's distribution, not the penalised or filtered one."""
    p = SamplingParams(
        temperature=0.5, top_k=2, repetition_penalty=3.0, logit_bias={1: 50.0}, logprobs=2, seed=0
    )
    seq = make_seq(p, [1, 11], seed=0)
    tok, lp = sample_token(LOGITS, seq)
    assert tok == 1  # the bias wins the draw
    ref = ref_logprobs(LOGITS)
    assert lp is not None and set(lp) == {11, 3, 1}
    for t, v in lp.items():
        assert math.isclose(v, ref[t], abs_tol=1e-12)
    p0 = SamplingParams(temperature=0)
    assert sample_token(LOGITS, make_seq(p0, [0]))[1] is None  # no logprobs unless asked
