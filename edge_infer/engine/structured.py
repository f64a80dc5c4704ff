"""Structured outputs on llguidance: a request's StructuredOutputsParams compiled once into a
grammar, one matcher per sequence, applied as that sequence's last logits processor (so only
constrained rows pay for a mask, and speculative proposals are verified against the masked
target: a proposal the grammar forbids is never accepted).

The processor keeps its matcher in step with the tokens it is shown (the sequence's output,
plus the proposals accepted so far while verifying): it consumes the new ones and rolls back
the ones that are gone (rejected proposals), then disallows every token the grammar does not
allow next. When the grammar is complete only the end-of-generation tokens remain.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_infer.errors import GenerationError, InvalidRequest
from edge_infer.sampling_params import StructuredOutputsParams
from edge_infer.tokenizer import Tokenizer
from edge_infer.tokenizer.vocab import Attr

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # the options' TypedDict, in llguidance's stub only

LogitsProcessor = Callable[[list[int], list[int], np.ndarray], None]
LEXER_FUEL = 200_000  # llguidance's initial_lexer_fuel (its default: 1,000,000; ~50k a millisecond)
# JSON as models write it ({"a": 1, "b": 2}), no free whitespace: a model cannot pad forever
_JSON_STYLE: JsonCompileOptions = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


class _GgufTokens:
    """What llguidance's TokenizerWrapper reads: each token's bytes (control tokens prefixed
    with 0xff, llguidance's mark of a special token), the EOS/BOS ids, and plain-text encoding."""

    def __init__(self, tok: Tokenizer, eos_ids: tuple[int, ...]) -> None:
        self._tok = tok
        self.eos_token_id = eos_ids[0]
        self.bos_token_id = tok.bos_id
        self.tokens: list[bytes] = []
        special = []
        for i in range(tok.vocab_size):
            piece = tok.token_to_piece(i, special=True)
            attr = tok.token_attr(i)
            if attr & Attr.CONTROL or (attr & Attr.USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
                special.append(i)
            self.tokens.append(piece)
        self.special_token_ids = special

    def __call__(self, text: str | bytes) -> list[int]:
        s = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
        return self._tok.encode(s, add_special=False, parse_special=False)


class GrammarCompiler:
    """Compiles constraints for one model's vocabulary (the llguidance tokenizer is built on
    first use: it walks the whole vocabulary once). Thread-safe: the engine compiles on the
    caller's thread (a hostile constraint can take seconds; llguidance releases the GIL), never
    on the engine thread."""

    def __init__(self, tokenizer: Tokenizer, eos_ids: tuple[int, ...], vocab_size: int) -> None:
        self._tokenizer, self._eos, self._vocab_size = tokenizer, tuple(eos_ids), vocab_size
        self._ll: Any = None
        self._lock = threading.Lock()

    def _lltokenizer(self) -> Any:
        with self._lock:
            if self._ll is None:
                import llguidance

                if not self._eos:
                    raise InvalidRequest("structured outputs need an end-of-generation token, and this model has none")
                wrapper = llguidance.TokenizerWrapper(_GgufTokens(self._tokenizer, self._eos))
                self._ll = llguidance.LLTokenizer(wrapper, n_vocab=self._vocab_size, eos_token=list(self._eos))
            return self._ll

    def processors(self, so: StructuredOutputsParams, n: int) -> list[LogitsProcessor]:
        """n independent processors (one per sequence) for the constraint; InvalidRequest when
        llguidance cannot compile it or fails its first step."""
        import llguidance

        # verbose_errors off: an error names the limit, not the parser state or the grammar.
        # A fifth of llguidance's default lexer fuel bounds a hostile constraint's compile (a{100000}:
        # ~0.2 s instead of ~2 s of a core per request) and still takes every real JSON schema tried.
        limits = llguidance.LLParserLimits(verbose_errors=False, initial_lexer_fuel=LEXER_FUEL)
        first = llguidance.LLMatcher(self._lltokenizer(), grammar_text(so), log_level=0, limits=limits)
        self._first_step(first)
        matchers = [first] + [first.deep_copy() for _ in range(n - 1)]
        return [_masker(m) for m in matchers]

    def _first_step(self, matcher: Any) -> None:
        """Run the constraint's first step on a copy: its lexer is built lazily, so a constraint
        past llguidance's limits (a{1000000}) compiles and then fails at its first mask or token;
        finding that here makes it a 400, not a failure inside a step."""
        if not matcher.is_error():
            probe = matcher.deep_copy()
            words = np.frombuffer(probe.compute_bitmask(), np.uint8)
            allowed = np.flatnonzero(np.unpackbits(words, count=self._vocab_size, bitorder="little"))
            token = next((int(t) for t in allowed if int(t) not in self._eos), None)
            if token is not None and not probe.is_error():
                probe.consume_token(token)
            if probe.is_error():
                raise InvalidRequest(f"structured outputs: the constraint does not compile: {_first_line(probe)}")
        if matcher.is_error():
            raise InvalidRequest(f"structured outputs: the constraint does not compile: {_first_line(matcher)}")


def _first_line(matcher: Any) -> str:
    return str(matcher.get_error()).strip().splitlines()[0] if matcher.get_error() else "unknown error"


def grammar_text(so: StructuredOutputsParams) -> str:
    """The llguidance grammar of a constraint (InvalidRequest for a malformed one)."""
    import llguidance

    try:
        if so.json is not None or so.json_object:
            schema = {"type": "object"} if so.json_object else so.json
            if isinstance(schema, str):
                schema = json.loads(schema)
            assert schema is not None  # json_object, or json given
            return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_STYLE))
        if so.regex is not None:
            return str(llguidance.LLMatcher.grammar_from_regex(so.regex))
        if so.choice is not None:
            alternatives = " | ".join(json.dumps(c) for c in so.choice)
            return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"))
        assert so.grammar is not None
        from llguidance.gbnf_to_lark import (
            any_to_lark,  # GBNF (llama.cpp's) or Lark, told apart by its syntax
        )

        return str(llguidance.LLMatcher.grammar_from_lark(any_to_lark(so.grammar)))
    except Exception as e:  # the converters raise ValueError, TypeError, or their own parse errors
        raise InvalidRequest(f"structured outputs: {e}") from None


def _masker(matcher: Any) -> LogitsProcessor:
    consumed: list[int] = []  # the tokens the matcher has taken, in order

    def mask(prompt: list[int], output: list[int], x: np.ndarray) -> None:
        same = 0
        limit = min(len(consumed), len(output))
        while same < limit and consumed[same] == output[same]:
            same += 1
        if same < len(consumed):  # tokens rolled back (rejected proposals, a preempted recompute)
            matcher.rollback(len(consumed) - same)
            del consumed[same:]
        for t in output[same:]:
            if not matcher.consume_token(t):
                raise GenerationError(f"structured outputs: token {t} violates the grammar: {_first_line(matcher)}")
            consumed.append(t)
        bits = matcher.compute_bitmask()
        if matcher.is_error():  # e.g. a limit of llguidance's reached only now: this sequence fails alone
            raise GenerationError(f"structured outputs: {_first_line(matcher)}")
        words = np.frombuffer(bits, np.uint8)  # bit t of the mask: token t allowed
        allowed = np.unpackbits(words, count=x.size, bitorder="little").view(np.bool_)
        x[~allowed] = -np.inf

    return mask
