"""Token logprobs in OpenAI's two shapes (completions and chat) from the engine's
per-token {token_id: logprob} dicts (top-n plus the chosen token)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_infer.tokenizer import Tokenizer


def _piece(tok: Tokenizer, token_id: int) -> bytes:
    return tok.token_to_piece(token_id)


def _top(d: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(d.items(), key=lambda kv: -kv[1])[:k]


def _lp(v: float | None) -> float | None:
    """A JSON-safe logprob (JSON has no -Infinity)."""
    return None if v is None else float(v) if math.isfinite(v) else -9999.0


def completion_logprobs(tok: Tokenizer, token_ids: list[int], logprobs: list[dict[int, float]], k: int,
                        offset: int = 0) -> dict[str, Any]:
    """{tokens, token_logprobs, top_logprobs, text_offset}; offsets count from `offset`."""
    tokens, chosen, tops, offsets = [], [], [], []
    pos = offset
    for t, d in zip(token_ids, logprobs):
        text = _piece(tok, t).decode("utf-8", errors="replace")
        tokens.append(text)
        chosen.append(_lp(d.get(t)))
        tops.append({_piece(tok, i).decode("utf-8", errors="replace"): _lp(v) for i, v in _top(d, k)})
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": chosen, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(
    tok: Tokenizer, token_ids: list[int], logprobs: list[dict[int, float]], k: int
) -> dict[str, Any]:
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    content = []
    for t, d in zip(token_ids, logprobs):
        content.append(
            {**_entry(tok, t, d.get(t)), "top_logprobs": [_entry(tok, i, v) for i, v in _top(d, k)]}
        )
    return {"content": content}


def _entry(tok: Tokenizer, token_id: int, logprob: float | None) -> dict[str, Any]:
    b = _piece(tok, token_id)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": _lp(logprob), "bytes": list(b)}
