"""What generation returns: RequestOutput with one CompletionOutput per sample (vLLM's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    """One sample. logprobs: per generated token, a dict token id -> logprob holding the top-n
    and the chosen token (None unless SamplingParams.logprobs was set). finish_reason: None
    while running, then "stop" | "length" | "abort" | "error"; stop_reason: the stop string or
    token id that ended it, if any; error: why it failed (finish_reason "error": its own
    constraints or logits left no token to sample, or its logits processor raised)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None
    stop_reason: str | int | None = None
    cumulative_logprob: float | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Times are time.monotonic() seconds; None until the event happened."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_generated_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served when it was first scheduled

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]


@dataclass(slots=True)
class RequestOutput:
    """A request's state: the prompt and its n samples. `.text`, `.token_ids` and
    `.finish_reason` are shortcuts for outputs[0]."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
