"""SamplingParams: vLLM's defaults, validation that names the field, from_dict."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_infer.errors import EdgeInferError, InvalidRequest
from edge_infer.sampling_params import SamplingParams

# vLLM's SamplingParams defaults for the fields we share.
VLLM_DEFAULTS = {
    "n": 1,
    "max_tokens": 16,
    "min_tokens": 0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "logit_bias": None,
    "seed": None,
    "stop": None,
    "stop_token_ids": None,
    "ignore_eos": False,
    "logprobs": None,
    "skip_special_tokens": True,
    "include_stop_str_in_output": False,
    "structured_outputs": None,
}


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert {f.name: getattr(p, f.name) for f in dataclasses.fields(p)} == VLLM_DEFAULTS
    assert not p.greedy


def test_frozen() -> None:
    p = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.0  # type: ignore[misc]


# (field, bad value): each must be rejected with a message naming the field.
INVALID = [
    ("n", 0),
    ("n", -1),
    ("n", 1.5),
    ("n", True),
    ("n", "2"),
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("max_tokens", 2.0),
    ("min_tokens", -1),
    ("min_tokens", 0.5),
    ("temperature", -0.1),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "hot"),
    ("temperature", True),
    ("temperature", 101.0),
    ("top_p", 0.0),
    ("top_p", -0.5),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 2.5),
    ("top_k", False),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", -3.0),
    ("seed", 1.5),
    ("seed", "42"),
    ("seed", True),
    ("logprobs", -1),
    ("logprobs", 21),
    ("logprobs", 1.0),
    ("logit_bias", [1, 2]),
    ("logit_bias", {"x": 1.0}),
    ("logit_bias", {5: 101.0}),
    ("logit_bias", {5: -100.5}),
    ("logit_bias", {5: math.nan}),
    ("logit_bias", {5: "1"}),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", [1, 2]),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [1.0]),
    ("stop_token_ids", [True]),
    ("stop_token_ids", ["1"]),
    ("ignore_eos", 1),
    ("ignore_eos", "yes"),
    ("skip_special_tokens", 0),
    ("include_stop_str_in_output", None),
]


@pytest.mark.parametrize(("name", "value"), INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_field_named(name: str, value: object) -> None:
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(**{name: value})
    assert name in str(e.value)
    # one exception family, and a ValueError for code that catches those
    assert isinstance(e.value, EdgeInferError) and isinstance(e.value, ValueError)


def test_min_tokens_above_max_tokens() -> None:
    with pytest.raises(InvalidRequest, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=4)
    assert SamplingParams(min_tokens=4, max_tokens=4).min_tokens == 4
    assert SamplingParams(min_tokens=100, max_tokens=None).min_tokens == 100


@pytest.mark.parametrize(
    ("name", "value"),
    [("top_k", -1), ("top_k", 0), ("top_p", 1.0), ("top_p", 1e-9), ("min_p", 1.0), ("temperature", 0),
     ("temperature", 100.0), ("presence_penalty", -2.0), ("frequency_penalty", 2.0), ("seed", -1),
     ("seed", 2**70), ("logprobs", 0), ("logprobs", 20), ("max_tokens", None), ("repetition_penalty", 1e-3)],
)
def test_boundary_values_accepted(name: str, value: object) -> None:
    assert getattr(SamplingParams(**{name: value}), name) == value


def test_stop_string_becomes_tuple() -> None:
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop=("a",)).stop == ("a",)
    assert SamplingParams(stop=[]).stop is None  # an empty list means no stop strings
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)


def test_logit_bias_normalised() -> None:
    p = SamplingParams(logit_bias={"7": 1, 3: -2.5})
    assert p.logit_bias == {7: 1.0, 3: -2.5}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())


def test_greedy() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=0.01).greedy


def test_from_dict_rejects_unknown_keys_naming_them() -> None:
    with pytest.raises(InvalidRequest) as e:
        SamplingParams.from_dict({"temperature": 0.5, "best_of": 2, "top_kk": 3})
    msg = str(e.value)
    assert "best_of" in msg and "top_kk" in msg
    assert "temperature" in msg.split("known:")[1]  # and lists what is known


def test_from_dict_validates_and_builds() -> None:
    p = SamplingParams.from_dict({"temperature": 0.5, "stop": "x", "max_tokens": 3})
    assert (p.temperature, p.stop, p.max_tokens) == (0.5, ("x",), 3)
    with pytest.raises(InvalidRequest, match="top_p"):
        SamplingParams.from_dict({"top_p": 2.0})


valid_params = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(1, 8),
        "max_tokens": st.one_of(st.none(), st.integers(32, 4096)),
        "min_tokens": st.integers(0, 16),  # <= every max_tokens drawn (default 16)
        "temperature": st.floats(0.0, 100.0),
        "top_p": st.floats(1e-6, 1.0),
        "top_k": st.integers(-1, 1000),
        "min_p": st.floats(0.0, 1.0),
        "repetition_penalty": st.floats(1e-3, 100.0),
        "presence_penalty": st.floats(-2.0, 2.0),
        "frequency_penalty": st.floats(-2.0, 2.0),
        "logit_bias": st.dictionaries(st.integers(0, 1000), st.floats(-100.0, 100.0), max_size=4),
        "seed": st.one_of(st.none(), st.integers(-(2**63), 2**64)),
        "stop": st.lists(st.text(min_size=1, max_size=4), max_size=3),
        "stop_token_ids": st.lists(st.integers(0, 1000), max_size=3),
        "ignore_eos": st.booleans(),
        "logprobs": st.one_of(st.none(), st.integers(0, 20)),
        "skip_special_tokens": st.booleans(),
    },
)


@given(valid_params)
def test_valid_params_roundtrip_through_from_dict(options: dict) -> None:
    p = SamplingParams.from_dict(options)
    again = SamplingParams.from_dict({f.name: getattr(p, f.name) for f in dataclasses.fields(p)})
    assert again == p
    if "stop" in options:
        assert p.stop == (tuple(options["stop"]) or None)
