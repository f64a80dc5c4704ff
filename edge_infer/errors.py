"""The one exception family of edge-infer: every user-facing failure is an EdgeInferError."""

from __future__ import annotations


class EdgeInferError(Exception):
    """Base of all errors edge-infer raises on purpose; the CLI prints these as one line."""


class GGUFError(EdgeInferError):
    """A GGUF file is malformed or unsupported; the message names the field and byte offset."""


class UnsupportedTensorType(EdgeInferError):
    """A tensor's quantization type cannot be used for inference (it still opens and inspects)."""


class UnsupportedModelError(EdgeInferError):
    """The model's architecture or hyper-parameters are outside what the runtime can run."""


class ConversionError(EdgeInferError):
    """A Hugging Face folder cannot be converted to GGUF: a missing or unreadable file, an
    unsupported architecture, a missing, unexpected or misshapen tensor; the message names it."""


class HubError(EdgeInferError):
    """Pulling or locating a model failed: unknown name, no network, bad checksum."""


class OutOfMemoryBudget(EdgeInferError):
    """The requested work cannot fit in the configured memory budget."""


class InvalidRequest(EdgeInferError, ValueError):
    """A request or option has a bad value; the message names the field."""


class TokenizerError(EdgeInferError):
    """The GGUF vocabulary cannot be used, or text/ids cannot be (de)tokenized; names the field or id."""


class ChatTemplateError(EdgeInferError, ValueError):
    """A chat template is missing, malformed, raised an error, or tried to leave its sandbox."""


class GenerationError(EdgeInferError):
    """One sequence failed inside a step (its constraints left no token to sample, its grammar
    matcher failed); that sequence ends with finish_reason "error", the rest of the batch goes on.
    The message names only that request's own data."""
