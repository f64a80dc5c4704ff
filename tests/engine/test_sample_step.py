"""Which logit rows a step needs whole on the host (the rest only as their argmax, which the
CUDA backend computes on the device), and StepLogits, what the sampler reads them from."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.engine.sample_step import sample_step, whole_rows
from edge_infer.engine.scheduler import ScheduledChunk
from edge_infer.engine.sequence import Sequence
from edge_infer.models.step_logits import StepLogits
from edge_infer.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def _decoding(params: SamplingParams) -> Sequence:
    seq = Sequence("r", [1, 2, 3], params, rng=np.random.default_rng(0))
    seq.num_computed_tokens = 3
    return seq


def test_only_rows_someone_samples_from_are_whole() -> None:
    plain = _decoding(GREEDY)
    sampled = _decoding(SamplingParams(temperature=0.8, max_tokens=4))
    logprobs = _decoding(SamplingParams(temperature=0.0, logprobs=1, max_tokens=4))
    penalised = _decoding(GREEDY)
    penalised.logits_processors = [lambda prompt, out, x: None]
    prefill = Sequence("p", list(range(10)), GREEDY)  # a chunk that does not reach the prompt's end
    follower_led = _decoding(GREEDY)
    follower_led.followers = [_decoding(SamplingParams(temperature=0.8, max_tokens=4))]
    chunks = [ScheduledChunk(plain, [3], [0]), ScheduledChunk(prefill, list(range(4)), []),
              ScheduledChunk(sampled, [3], [0]), ScheduledChunk(logprobs, [3, 4, 5], [0, 1, 2], num_proposed=2),
              ScheduledChunk(penalised, [3], [0]), ScheduledChunk(follower_led, [3], [0])]
    assert whole_rows(chunks).tolist() == [False, True, True, True, True, True, True]


def test_argmax_only_rows_sample_from_the_backends_argmax() -> None:
    v = 8
    rows = np.zeros((1, v), np.float32)
    rows[0, 5] = 1.0
    logits = StepLogits(rows, where=np.array([-1, 0]), greedy=np.array([3, 5], np.int32))
    assert logits.argmax(0) == 3 and logits.argmax(1) == 5 and logits.row(1)[5] == 1.0
    with pytest.raises(LookupError, match="row 0 was not copied"):
        logits.row(0)
    plain, sampled = _decoding(GREEDY), _decoding(SamplingParams(temperature=0.5, max_tokens=4, seed=1))
    out = sample_step([ScheduledChunk(plain, [3], [0]), ScheduledChunk(sampled, [3], [0])], logits, None)
    assert out[0].token_ids == [3]  # the device's argmax, no host row needed
    assert out[1].token_ids[0] in range(v)


def test_host_logits_give_numpys_argmax() -> None:
    rows = np.array([[0.0, 2.0, 2.0, 1.0]], np.float32)
    assert StepLogits(rows).argmax(0) == 1  # the lowest index of a tie, as np.argmax
