"""Sequence: one stream of tokens being generated, and the scheduling state the engine keeps.

The single scheduling idea (vLLM v1): `num_computed_tokens` catches up with `num_tokens`.
A prompt, a chunk of it, one decode token or k speculative tokens are all "the next
num_tokens - num_computed_tokens tokens" of a sequence.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edge_infer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from edge_infer.engine.image_prompt import ImageSpan
    from edge_infer.tokenizer.detok import IncrementalDetokenizer

# processor(prompt ids, output ids, logits float32 [V]) changes the logits in place (sampler.py)
LogitsProcessor = Callable[[list[int], list[int], np.ndarray], None]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # this sequence failed inside a step (its own cause in Sequence.error)

    @property
    def finished(self) -> bool:
        return self not in (SequenceStatus.WAITING, SequenceStatus.RUNNING)


_seq_ids = itertools.count()


@dataclass(eq=False, slots=True)
class Sequence:
    """token_ids = prompt_token_ids + output_token_ids; block_table holds KV block ids for the
    first num_computed_tokens tokens (and slots reserved for the ones being computed).

    `index` is the sample number within its request (n > 1); followers of a request with n > 1
    wait for the leader's prompt and are forked from it (sharing its KV blocks).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    index: int = 0
    priority: int = 0
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    state_slot: int = -1  # a hybrid model's recurrent-state slot (the block manager's), -1: none
    pending_snapshots: dict[int, int] = field(default_factory=dict)  # block index -> snapshot slot being computed
    spec_slots: list[int] = field(default_factory=list)  # a verification step's state slots, one per proposal
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    num_preemptions: int = 0
    stop_reason: str | int | None = None
    error: str | None = None  # why it finished with FINISHED_ERROR (names only its own request's data)
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    rng: np.random.Generator | None = None
    followers: list[Sequence] = field(default_factory=list)  # n > 1: samples forked after prefill
    spec_token_ids: list[int] = field(default_factory=list)  # proposed, not yet verified
    logits_processors: list[LogitsProcessor] = field(default_factory=list)  # built once per request
    # output text state (owned by the engine's detokenizer)
    text: str = ""
    detok: IncrementalDetokenizer | None = None
    # context shift (engine/context_shift.py): the model's context is the first ctx_keep tokens
    # and the tokens after the next ctx_dropped ones; positions, num_tokens and the token views
    # below count in it. Blocks from no_cache_from on hold shifted K/V: never prefix-cached.
    ctx_keep: int = 0
    ctx_dropped: int = 0
    no_cache_from: int | None = None
    # a chat's prompt: where its messages after the first begin, and its reply (prompt offsets;
    # ChatTemplate.message_starts), for a shift that keeps the first message and drops whole ones
    message_starts: tuple[int, ...] = ()
    # images (engine/image_prompt.py): the spans of prompt positions their embeddings fill, and
    # the prompt's ids as block keys (each span's positions keyed by its image; None: no images)
    images: tuple[ImageSpan, ...] = ()
    prompt_keys: list[int] | None = None
    # LoRA adapters (engine/lora.py): (slot, scale) pairs; its prompt_keys then start with the
    # adapters' key, so its blocks are never another adapter's (or the base's)
    lora: tuple[tuple[int, float], ...] = ()

    @property
    def num_tokens(self) -> int:
        """Tokens in the model's context (all of them unless a context shift dropped some)."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.ctx_dropped

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    def token_at(self, i: int) -> int:
        if self.ctx_dropped and i >= self.ctx_keep:
            i += self.ctx_dropped
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    def tokens_slice(self, start: int, stop: int) -> list[int]:
        """Context tokens start..stop-1."""
        if self.ctx_dropped:
            return self.all_token_ids()[start:stop]
        n = len(self.prompt_token_ids)
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n : stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - n]

    def all_token_ids(self) -> list[int]:
        """The context's tokens (prompt and outputs, less what a context shift dropped)."""
        every = self.prompt_token_ids + self.output_token_ids
        if self.ctx_dropped:
            return every[: self.ctx_keep] + every[self.ctx_keep + self.ctx_dropped :]
        return every

    def cache_key_ids(self) -> list[int]:
        """The context's ids as the prefix cache keys blocks: image positions by their image."""
        if self.prompt_keys is None:
            return self.all_token_ids()
        every = self.prompt_keys + self.output_token_ids
        if self.ctx_dropped:
            return every[: self.ctx_keep] + every[self.ctx_keep + self.ctx_dropped :]
        return every

    def cache_key_slice(self, start: int, stop: int) -> list[int]:
        """cache_key_ids()[start:stop]."""
        if self.prompt_keys is None:
            return self.tokens_slice(start, stop)
        if not self.ctx_dropped and stop <= len(self.prompt_keys):
            return self.prompt_keys[start:stop]
        return self.cache_key_ids()[start:stop]

    def reset_for_recompute(self) -> None:
        """Preemption: drop the KV state; prompt + outputs so far will be recomputed."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.state_slot = -1
        self.spec_token_ids = []
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
