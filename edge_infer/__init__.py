"""edge-infer: a CPU/edge-first LLM inference runtime for GGUF models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_infer._version import __version__
from edge_infer.errors import EdgeInferError
from edge_infer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from edge_infer.llm import LLM

__all__ = ["LLM", "SamplingParams", "EdgeInferError", "__version__"]


def __getattr__(name: str) -> Any:
    # LLM pulls in numba and the kernels: import it only when asked for (keeps the CLI's
    # `inspect`/`models` and the GGUF reader fast to start).
    if name == "LLM":
        from edge_infer.llm import LLM

        return LLM
    raise AttributeError(name)
