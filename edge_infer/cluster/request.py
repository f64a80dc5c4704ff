"""What the ingress sends an engine replica: a typed request (the router reads its prompt)."""

from __future__ import annotations

from dataclasses import dataclass

from edge_infer.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One engine request: prompt token ids (already templated and tokenized by the ingress),
    the sampling parameters and the request id (the engine's and the client's)."""

    prompt: list[int]
    params: SamplingParams
    request_id: str
    message_starts: tuple[int, ...] = ()  # a chat prompt's (ChatTemplate.message_starts)
