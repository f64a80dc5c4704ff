"""edge-infer: a CPU/edge-first LLM inference runtime for GGUF models."""

from __future__ import annotations

from edge_infer.errors import EdgeInferError

__version__ = "0.1.0"
__all__ = ["EdgeInferError", "__version__"]
