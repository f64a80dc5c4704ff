"""edge-infer: a CPU/edge-first LLM inference runtime for GGUF models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_infer.errors import EdgeInferError
from edge_infer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from edge_infer.llm import LLM

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "EdgeInferError", "__version__"]


def __getattr__(name: str) -> Any:
    # LLM pulls in numba and the kernels: import it only when asked for (keeps the CLI's
    # `inspect`/`models` and the GGUF reader fast to start).
    if name == "LLM":
        from edge_infer.llm import LLM

        return LLM
    raise AttributeError(name)
