"""Structured outputs through the server with the official `openai` client: `parse()` with a
pydantic model returns a parsed object on every one of 20 prompts; json_object, vLLM's
`structured_outputs` and its older `guided_*` fields; streamed constrained output; constraints
that do not compile, two constraint fields at once, unknown fields and tools for a template
with no tool-call format are 400s naming them."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

KEY = "sk-test-structured"
MODEL = "smollm2-135m"


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    mood: Literal["happy", "sad", "calm"]
    friends: list[Annotated[str, Field(max_length=20)]] = Field(max_length=3)  # bounded: a 135M model rambles


@pytest.fixture(scope="module")
def client(start_server, smollm2_path: Path):  # type: ignore[no-untyped-def]
    srv = start_server(smollm2_path, "-t", "2", "--kv-cache-memory", "64MiB", "--max-model-len", "1024",
                       "--max-num-seqs", "8", "--api-key", KEY)
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_parse_returns_an_object_on_twenty_prompts(client) -> None:  # type: ignore[no-untyped-def]
    topics = ["a pirate", "a baker", "a student", "an astronaut", "a farmer", "a poet", "a nurse", "a chef",
              "a pilot", "a child", "a king", "a robot", "a painter", "a doctor", "a sailor", "a dancer",
              "a coder", "a judge", "a monk", "a singer"]

    def one(i: int) -> Person | None:
        r = client.chat.completions.parse(model=MODEL, messages=_user(f"Describe {topics[i]} as a person."),
                                          response_format=Person, max_tokens=200, temperature=0.7, seed=i)
        return r.choices[0].message.parsed

    with ThreadPoolExecutor(8) as pool:
        parsed = list(pool.map(one, range(20)))
    assert all(isinstance(p, Person) for p in parsed), parsed


def test_json_object_structured_outputs_and_guided_aliases(client) -> None:  # type: ignore[no-untyped-def]
    r = client.chat.completions.create(model=MODEL, messages=_user("Is water wet?"), max_tokens=8, temperature=0,
                                       extra_body={"guided_choice": ["yes", "no"]})
    assert r.choices[0].message.content in ("yes", "no")
    r = client.chat.completions.create(model=MODEL, messages=_user("A code."), max_tokens=16, temperature=0.9,
                                       extra_body={"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{4}"}})
    assert len(r.choices[0].message.content) == 7 and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=MODEL, prompt="Colour:", max_tokens=8, temperature=0,
                                  extra_body={"guided_grammar": 'root ::= " " ("red" | "blue")'})
    assert r.choices[0].text in (" red", " blue")
    r = client.chat.completions.create(model=MODEL, messages=_user("Give a JSON object with one key."), max_tokens=64,
                                       temperature=0, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason != "stop" or isinstance(json.loads(r.choices[0].message.content), dict)
    assert r.choices[0].message.content.startswith("{")


def test_streamed_constrained_output_is_the_same(client) -> None:  # type: ignore[no-untyped-def]
    kw = dict(model=MODEL, messages=_user("Describe a cat as a person."), max_tokens=200, temperature=0,
              response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": Person.model_json_schema()}})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices]
    assert "".join(parts) == whole
    Person.model_validate_json(whole)


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}}},
     None, "frobnicate"),
    ({"response_format": {"type": "yaml"}}, "response_format", "text, json_object or json_schema"),
    ({"guided_regex": "(", "guided_choice": ["a"]}, "guided_choice", "give one of"),
    ({"frobnicate": 1}, "frobnicate", "not supported"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "no tool-call format"),  # SmolLM2's template
    ({"messages": [{"role": "user", "content": "x", "audio": {"id": "a1"}}]}, "messages[0].audio", "not supported"),
], ids=["bad-schema", "bad-type", "two-constraints", "unknown-field", "tools-unknown-format", "message-field"])
def test_bad_constraints_and_fields_are_400(client, extra, param, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=_user("x"), max_tokens=4, extra_body=extra)
    err = e.value.body
    assert words in err["message"], err
    if param:
        assert err["param"] == param, err
