"""Request: a prompt, its sampling parameters and its n sequences; builds RequestOutputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_infer.engine.sequence import Sequence
from edge_infer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from edge_infer.sampling_params import SamplingParams


@dataclass(eq=False, slots=True)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # params.max_tokens, or what the context leaves when that is None
    metrics: RequestMetrics
    seqs: list[Sequence] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)

    def output(self) -> RequestOutput:
        outs = []
        # While running, hold back a possible start of a stop string, so streamed text never
        # has to be taken back when the stop string completes.
        hold = max(len(x) for x in self.params.stop) - 1 if self.params.stop else 0
        for s in self.seqs:
            reason = s.status.value if s.is_finished else None
            text = s.text if s.is_finished or not hold else s.text[: max(0, len(s.text) - hold)]
            outs.append(CompletionOutput(
                index=s.index,
                text=text,
                token_ids=list(s.output_token_ids),
                finish_reason=reason,
                logprobs=list(s.output_logprobs) if self.params.logprobs is not None else None,
                stop_reason=s.stop_reason,
                cumulative_logprob=s.cumulative_logprob if self.params.logprobs is not None else None,
                error=s.error,
            ))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, self.finished, self.metrics)
