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
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_infer.errors import InvalidRequest
from edge_infer.sampling_params import StructuredOutputsParams
from edge_infer.tokenizer import Tokenizer
from edge_infer.tokenizer.vocab import Attr

LogitsProcessor = Callable[[list[int], list[int], np.ndarray], None]
# JSON as models write it ({"a": 1, "b": 2}), no free whitespace: a model cannot pad forever
_JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


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
    first use: it walks the whole vocabulary once)."""

    def __init__(self, tokenizer: Tokenizer, eos_ids: tuple[int, ...], vocab_size: int) -> None:
        self._tokenizer, self._eos, self._vocab_size = tokenizer, tuple(eos_ids), vocab_size
        self._ll: Any = None

    def _lltokenizer(self) -> Any:
        if self._ll is None:
            import llguidance

            if not self._eos:
                raise InvalidRequest("structured outputs need an end-of-generation token, and this model has none")
            wrapper = llguidance.TokenizerWrapper(_GgufTokens(self._tokenizer, self._eos))
            self._ll = llguidance.LLTokenizer(wrapper, n_vocab=self._vocab_size, eos_token=list(self._eos))
        return self._ll

    def processors(self, so: StructuredOutputsParams, n: int) -> list[LogitsProcessor]:
        """n independent processors (one per sequence) for the constraint; InvalidRequest when
        llguidance cannot compile it."""
        import llguidance

        first = llguidance.LLMatcher(self._lltokenizer(), grammar_text(so), log_level=0)  # compiles it
        if first.is_error():
            raise InvalidRequest(f"structured outputs: the constraint does not compile: {first.get_error()}")
        matchers = [first] + [first.deep_copy() for _ in range(n - 1)]
        return [_masker(m) for m in matchers]


def grammar_text(so: StructuredOutputsParams) -> str:
    """The llguidance grammar of a constraint (InvalidRequest for a malformed one)."""
    import llguidance

    try:
        if so.json is not None or so.json_object:
            schema = {"type": "object"} if so.json_object else so.json
            if isinstance(schema, str):
                schema = json.loads(schema)
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
                raise RuntimeError(f"structured outputs: token {t} violates the grammar: {matcher.get_error()}")
            consumed.append(t)
        words = np.frombuffer(matcher.compute_bitmask(), np.uint8)  # bit t of the mask: token t allowed
        allowed = np.unpackbits(words, count=x.size, bitorder="little").view(np.bool_)
        x[~allowed] = -np.inf

    return mask
