"""A failure belongs to its sequence (issue #33, finding 1).

Requests that could never be satisfied are refused before they run, naming the field; one
that still fails inside a step (its grammar and min_tokens leave no token, its model's logits
are NaN) ends alone with finish_reason "error", and the requests batched with it produce the
very tokens they produce alone (batch invariance makes that exact). Before this, each of these
raised out of LLMEngine.step() and the engine thread failed every request in flight.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from tiny_models import write_tiny_llama

from edge_infer import LLM, SamplingParams
from edge_infer.errors import InvalidRequest
from edge_infer.sampling_params import StructuredOutputsParams

PROMPT = "The capital of France is"
VICTIM = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _constrained(**kw: object) -> SamplingParams:
    so = kw.pop("so")
    return SamplingParams(structured_outputs=so, max_tokens=16, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def llm(smollm2_path: Path):
    with LLM(str(smollm2_path), n_threads=2, kv_cache_memory="64MiB") as m:
        yield m


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_choice_shorter_than_min_tokens_is_refused(llm: LLM, temperature: float) -> None:
    params = _constrained(so=StructuredOutputsParams(choice=("a",)), min_tokens=4, temperature=temperature)
    with pytest.raises(InvalidRequest, match=r"^min_tokens \(4\) cannot be honoured.*longest choice is 1 bytes"):
        llm.generate([PROMPT], params)


@pytest.mark.slow
def test_stop_ids_covering_the_vocabulary_with_min_tokens_are_refused(llm: LLM) -> None:
    params = SamplingParams(stop_token_ids=list(range(llm.model_config.vocab_size)), min_tokens=1, max_tokens=4)
    with pytest.raises(InvalidRequest, match="^stop_token_ids cover the whole vocabulary"):
        llm.generate([PROMPT], params)
    # the same ids without min_tokens are a legal (if odd) request: it stops at its first token
    out = llm.generate([PROMPT], SamplingParams(stop_token_ids=list(range(llm.model_config.vocab_size)), max_tokens=4))
    assert out[0].outputs[0].finish_reason == "stop" and len(out[0].outputs[0].token_ids) == 1


@pytest.mark.slow
def test_a_constraint_too_large_for_llguidance_is_refused_when_compiled(llm: LLM) -> None:
    with pytest.raises(InvalidRequest, match="^structured outputs: the constraint does not compile"):
        llm.generate([PROMPT], _constrained(so=StructuredOutputsParams(regex="a{1000000}")))


@pytest.mark.slow
def test_a_sequence_that_fails_in_a_step_ends_alone(llm: LLM) -> None:
    solo = llm.generate([PROMPT], VICTIM)[0].outputs[0].token_ids
    # regex "a" then min_tokens 4: once "a" is out only the end is allowed, and min_tokens holds it back
    # (a regex's longest match is not known before it runs, so this one gets to a step)
    attacks = [
        _constrained(so=StructuredOutputsParams(regex="a"), min_tokens=4, temperature=1.0, seed=1),
        _constrained(so=StructuredOutputsParams(regex="a"), min_tokens=4, temperature=0.0),
        _constrained(so=StructuredOutputsParams(regex="a"), min_tokens=4, temperature=1.0, n=3, seed=2),
    ]
    outs = llm.generate([PROMPT, "Hello", "Hello", "Hello", PROMPT], [VICTIM, *attacks, VICTIM])
    for victim in (outs[0], outs[-1]):
        assert victim.outputs[0].token_ids == solo
        assert victim.outputs[0].finish_reason == "length" and victim.outputs[0].error is None
    for attacked in outs[1:-1]:
        for c in attacked.outputs:
            assert c.finish_reason == "error"
            assert c.error is not None and c.error.startswith("no token can be generated")
    # the engine goes on serving, and nothing is left holding KV blocks
    assert llm.generate([PROMPT], VICTIM)[0].outputs[0].token_ids == solo
    m = llm.metrics()
    assert m["running"] == 0 and m["kv_blocks_used"] == 0


def _nan_model(path: Path) -> Path:
    """A tiny llama whose final norm is NaN: every logit of every row is NaN."""
    write_tiny_llama(path)
    t = next(t for t in GGUFReader(path).tensors if t.name == "output_norm.weight")
    with open(path, "r+b") as f:
        f.seek(int(t.data_offset))
        f.write(np.full(int(t.n_elements), np.nan, np.float32).tobytes())
    return path


def test_nan_logits_end_the_sequence_not_the_engine(tmp_path: Path) -> None:
    with LLM(str(_nan_model(tmp_path / "nan.gguf")), n_threads=1, kv_cache_memory="8MiB") as m:
        outs = m.generate(["hello"] * 3, [SamplingParams(max_tokens=4, temperature=1.0, seed=0),
                                          SamplingParams(max_tokens=4, temperature=0.0, logprobs=1),
                                          SamplingParams(max_tokens=4, temperature=0.0)])
        for o in outs:
            assert o.outputs[0].finish_reason == "error"
            assert "NaN" in (o.outputs[0].error or "")
        assert m.metrics()["kv_blocks_used"] == 0
