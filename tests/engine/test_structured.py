"""Structured outputs (llguidance) through the Python API on the real SmolLM2: 50 random JSON
schemas always give output jsonschema accepts; regex, choice, Lark and GBNF grammars match;
constraints that do not compile are InvalidRequest naming the problem; speculative decoding
and n > 1 keep the constraint; an unconstrained request batched with constrained ones is
unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from json_schemas import random_schema

from edge_infer import LLM, SamplingParams
from edge_infer.errors import InvalidRequest
from edge_infer.sampling_params import StructuredOutputsParams as SO


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):  # type: ignore[no-untyped-def]
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="64MiB") as m:
        yield m


def _ask(llm: LLM, text: str) -> list[int]:
    return llm.chat_prompt([{"role": "user", "content": text}])


def test_random_schemas_always_validate(llm: LLM) -> None:
    """Twenty random schemas, generated in one batch: every output parses and validates."""
    rng = np.random.default_rng(0)
    schemas = [random_schema(rng) for _ in range(20)]
    prompts = [_ask(llm, "Reply with JSON for this schema: " + json.dumps(s)) for s in schemas]
    params = [SamplingParams(max_tokens=256, temperature=0.8, seed=i, structured_outputs=SO(json=s))
              for i, s in enumerate(schemas)]
    for s, out in zip(schemas, llm.generate(prompts, params)):
        o = out.outputs[0]
        assert o.finish_reason == "stop", (o.finish_reason, o.text)
        jsonschema.validate(json.loads(o.text), s)


@pytest.mark.parametrize(("so", "pattern"), [
    (SO(regex=r"[0-9]{3}-[a-z]{2,4}"), r"[0-9]{3}-[a-z]{2,4}"),
    (SO(choice=("yes", "no", "maybe")), r"yes|no|maybe"),
    (SO(grammar='start: "colour: " COLOUR\nCOLOUR: "red" | "green"'), r"colour: (red|green)"),
    (SO(grammar='root ::= "n=" [0-9] [0-9]?'), r"n=[0-9][0-9]?"),  # GBNF, llama.cpp's dialect
], ids=["regex", "choice", "lark", "gbnf"])
def test_regex_choice_and_grammars_match(llm: LLM, so: SO, pattern: str) -> None:
    outs = llm.generate([_ask(llm, "Answer.")] * 4,
                        [SamplingParams(max_tokens=64, temperature=1.0, seed=s, structured_outputs=so) for s in range(4)])
    for out in outs:
        assert out.outputs[0].finish_reason == "stop" and re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text


def test_json_object_gives_objects(llm: LLM) -> None:
    """Free-form JSON has no bound on its length, and this 135M model often repeats itself in
    an array until max_tokens: the ones that stop are objects, and most stop."""
    outs = llm.generate([_ask(llm, "Give a JSON object with a name and an age.")] * 8,
                        [SamplingParams(max_tokens=128, temperature=0.7, seed=s, structured_outputs=SO(json_object=True))
                         for s in range(8)])
    stopped = [o.outputs[0].text for o in outs if o.outputs[0].finish_reason == "stop"]
    assert len(stopped) >= 4, [o.outputs[0].text for o in outs]
    assert all(isinstance(json.loads(t), dict) for t in stopped)


@pytest.mark.parametrize(("so", "words"), [
    (SO(json='{"type": "object", "properties": {'), "structured outputs"),
    (SO(json={"type": "object", "properties": {"a": {"type": "frobnicate"}}}), "frobnicate"),
    (SO(regex="(unclosed"), "does not compile"),
    (SO(grammar="start: undefined_rule"), "undefined_rule"),
], ids=["malformed-json", "unknown-type", "bad-regex", "bad-grammar"])
def test_constraints_that_do_not_compile_are_refused(llm: LLM, so: SO, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        llm.generate([_ask(llm, "x")], SamplingParams(max_tokens=8, structured_outputs=so))


def test_params_are_validated() -> None:
    with pytest.raises(InvalidRequest, match="exactly one of"):
        SO(regex="a", choice=("b",))
    with pytest.raises(InvalidRequest, match="exactly one of .* got none"):
        SO()
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        SamplingParams(ignore_eos=True, structured_outputs=SO(regex="a"))
    assert SamplingParams(structured_outputs={"choice": ["a", "b"]}).structured_outputs == SO(choice=("a", "b"))


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "rank"], "additionalProperties": False}


def test_speculation_n2_and_unconstrained_neighbours(smollm2_path: Path, llm: LLM) -> None:
    prompt = _ask(llm, "Name a city and rank it, as JSON. Then name it again: the city, the city.")
    greedy = SamplingParams(max_tokens=64, temperature=0.0, structured_outputs=SO(json=SCHEMA))
    plain = llm.generate([prompt], greedy)[0].outputs[0]
    jsonschema.validate(json.loads(plain.text), SCHEMA)
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="64MiB", speculative={"method": "ngram", "k": 4}) as spec:
        assert spec.generate([prompt], greedy)[0].outputs[0].token_ids == plain.token_ids
    two = llm.generate([prompt], SamplingParams(n=2, max_tokens=64, temperature=1.0, seed=3, structured_outputs=SO(json=SCHEMA)))
    for o in two[0].outputs:
        jsonschema.validate(json.loads(o.text), SCHEMA)
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = llm.generate([prompt], free)[0].outputs[0].token_ids
    mixed = llm.generate([prompt, prompt, prompt], [greedy, free, greedy])
    assert mixed[1].outputs[0].token_ids == alone
    assert mixed[0].outputs[0].token_ids == plain.token_ids
