"""Which tokens a context shift drops (engine/context_shift.py's ContextShift.span), on
sequences alone: llama.cpp's rule with context_keep set, and by default a chat's first message
kept and its oldest whole messages dropped."""

from __future__ import annotations

from typing import Any

import pytest

from edge_infer.engine.context_shift import ContextShift
from edge_infer.engine.sequence import Sequence
from edge_infer.sampling_params import SamplingParams

STARTS = (11, 190, 373, 567, 700)  # the 2nd .. 5th messages, then the reply


def seq(computed: int, starts: tuple[int, ...] = STARTS, dropped: int = 0, keep: int = 0) -> Sequence:
    s = Sequence("r", list(range(computed + 1 + dropped)), SamplingParams(), message_starts=starts)
    s.num_computed_tokens, s.ctx_dropped, s.ctx_keep = computed, dropped, keep
    return s


def shift(keep: int | None, bos: int = 1, max_model_len: int = 1001) -> ContextShift:
    none: Any = None  # span touches neither the scheduler nor the runner
    return ContextShift(keep, bos, max_model_len, none, none)


def test_a_chat_keeps_its_first_message_and_drops_the_oldest_whole_ones() -> None:
    """989 tokens after the kept 11: llama.cpp's half is 494, the starts after 11 are 179, 362,
    556 and 689 of them; 556 is nearest."""
    assert shift(None).span(seq(1000)) == (11, 556)
    assert shift(None).span(seq(1000, (11, 190, 373, 450, 700))) == (11, 439)  # 439 is nearer than 689


@pytest.mark.parametrize(("starts", "want"), [((11, 190), (11, 494)), ((11, 999), (11, 494)), ((11, 950), (11, 494)),
                                              ((), (1, 499))])
def test_no_start_in_the_middle_half_is_llama_cpps_half(starts: tuple[int, ...], want: tuple[int, int]) -> None:
    """Starts before a quarter or past three quarters (the reply just begun: dropping all but the
    first message would lose the question) are no place to cut; a prompt that is not a chat
    keeps BOS."""
    assert shift(None).span(seq(1000, starts)) == want


def test_a_second_shift_counts_the_starts_in_the_shifted_context() -> None:
    """After 556 dropped, the 5th message (700) sits at 144, 133 after the kept 11: with 600
    computed (589 after them) that is before a quarter; a reply starting at 900 (333 after) is
    in the middle half."""
    assert shift(None).span(seq(600, dropped=556, keep=11)) == (11, 294)
    assert shift(None).span(seq(600, STARTS[:-1] + (900,), dropped=556, keep=11)) == (11, 333)


def test_context_keep_is_llama_cpps_rule() -> None:
    """context_keep set: BOS plus that many tokens, half of the rest, message starts ignored;
    the kept count is at most max_model_len - 4."""
    assert shift(8).span(seq(1000)) == (9, (1000 - 9) // 2)
    assert shift(0, bos=0).span(seq(1000)) == (0, 500)
    assert shift(5000).span(seq(1000)) == (997, 1)
