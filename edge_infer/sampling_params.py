"""SamplingParams: how to pick tokens, with vLLM's field names, defaults and meanings."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from edge_infer.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """A constraint on the generated text (vLLM's shape), exactly one of: json, a JSON schema
    (a dict or its JSON text); json_object, any JSON object; regex, a regular expression the
    whole output matches; choice, one of these strings; grammar, a Lark grammar (llguidance's
    dialect) or a GBNF one (llama.cpp's, recognised by its `::=` rules). Compiled by llguidance;
    a constraint it cannot compile is refused with InvalidRequest naming the problem."""

    json: str | dict | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [n for n in ("json", "regex", "choice", "grammar") if getattr(self, n) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise InvalidRequest(
                "structured outputs take exactly one of json, json_object, regex, choice, grammar; got "
                + (", ".join(given) if given else "none")
            )
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise InvalidRequest(f"structured outputs json must be a JSON schema (an object or its text), got {type(self.json).__name__}")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise InvalidRequest(f"structured outputs {name} must be a non-empty string")
        if self.choice is not None:
            choice = (self.choice,) if isinstance(self.choice, str) else tuple(self.choice)
            if not choice or not all(isinstance(c, str) and c for c in choice):
                raise InvalidRequest("structured outputs choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", choice)
        if not isinstance(self.json_object, bool):
            raise InvalidRequest(f"structured outputs json_object must be a boolean, got {self.json_object!r}")

    @classmethod
    def from_dict(cls, options: dict) -> StructuredOutputsParams:
        """Build from a dict, rejecting unknown keys with a message that names them."""
        return cls(**_known_options(cls, options, "structured outputs option"))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling settings (vLLM semantics).

    Processing order on each step's logits: logit_bias, min_tokens (EOS/stop ids masked),
    repetition/frequency/presence penalties, temperature, then min_p, top_k and top_p; a
    temperature of 0 is greedy (argmax after the penalties). Returned logprobs are those of the
    model's raw distribution (before any processing).

    n: completions per prompt; max_tokens: cap on generated tokens (None = up to the context
    length); min_tokens: tokens generated before EOS/stop ids are allowed; top_k: 0 or -1 = off;
    top_p: 1.0 = off; min_p: 0.0 = off; repetition_penalty: 1.0 = off (divides positive,
    multiplies negative logits of tokens in prompt or output); presence/frequency penalties:
    OpenAI's, over output tokens; logit_bias: token id -> added logit; seed: same seed, same
    output; stop: strings that end the output (not included unless include_stop_str_in_output);
    stop_token_ids: extra ids that end it (included in token_ids, not in text); ignore_eos:
    keep going past EOS; logprobs: number of top logprobs returned per generated token
    (the chosen token's is always included); skip_special_tokens: leave control tokens out of
    the text.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequest(f"min_tokens must be at most max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _check_float("temperature", self.temperature, 0.0, 100.0)
        _check_float("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_int("top_k", self.top_k, -1)
        _check_float("min_p", self.min_p, 0.0, 1.0)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, 100.0, low_open=True)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.seed is not None:
            _check_int("seed", self.seed, -(2**63))
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0)
            if self.logprobs > 20:
                raise InvalidRequest(f"logprobs must be at most 20, got {self.logprobs}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise InvalidRequest(f"logit_bias must be a dict of token id -> bias, got {type(self.logit_bias).__name__}")
            bias = {}
            for k, v in self.logit_bias.items():
                try:
                    tok = int(k)
                except (TypeError, ValueError):
                    raise InvalidRequest(f"logit_bias keys must be token ids, got {k!r}") from None
                _check_float(f"logit_bias[{tok}]", v, -100.0, 100.0)
                bias[tok] = float(v)
            object.__setattr__(self, "logit_bias", bias)
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is not None:
            stop = tuple(stop)
            if not all(isinstance(s, str) and s for s in stop):
                raise InvalidRequest("stop must be a non-empty string or a list of non-empty strings")
            object.__setattr__(self, "stop", stop or None)
        if self.stop_token_ids is not None:
            ids = tuple(self.stop_token_ids)
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise InvalidRequest("stop_token_ids must be a list of non-negative token ids")
            object.__setattr__(self, "stop_token_ids", ids)
        so = self.structured_outputs
        if isinstance(so, dict):
            so = StructuredOutputsParams.from_dict(so)
            object.__setattr__(self, "structured_outputs", so)
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise InvalidRequest(f"structured_outputs must be StructuredOutputsParams, got {type(so).__name__}")
        if so is not None and self.ignore_eos:
            raise InvalidRequest("ignore_eos cannot be combined with structured_outputs: the constraint ends generation")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequest(f"{name} must be a boolean, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @classmethod
    def from_dict(cls, options: dict) -> SamplingParams:
        """Build from a dict, rejecting unknown keys with a message that names them."""
        return cls(**_known_options(cls, options, "sampling option"))


def _known_options(cls: type, options: dict, what: str) -> dict:
    """options, when every key is a field of the dataclass cls; else InvalidRequest naming them."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidRequest(f"unknown {what}(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return options


def _check_int(name: str, v: object, low: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise InvalidRequest(f"{name} must be an integer, got {v!r}")
    if v < low:
        raise InvalidRequest(f"{name} must be at least {low}, got {v}")


def _check_float(name: str, v: object, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidRequest(f"{name} must be a finite number, got {v!r}")
    if v < low or v > high or (low_open and v <= low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise InvalidRequest(f"{name} must be in {bound}, got {v}")
