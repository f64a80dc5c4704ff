"""Seeded random JSON schemas for the structured-output tests: nested objects, arrays, enums,
strings, integers and numbers with bounds, every property required and nothing else allowed.
Strings and arrays carry maxLength / maxItems and numbers a bounded number of digits, so a
constrained generation always ends within a modest max_tokens."""

from __future__ import annotations

from typing import Any

import numpy as np

WORDS = ["red", "green", "blue", "small", "large", "north", "south", "alpha", "beta", "gamma"]


def random_schema(rng: np.random.Generator, depth: int = 0) -> dict[str, Any]:
    n = int(rng.integers(1, 4))
    names = rng.choice(["id", "name", "size", "color", "count", "score", "items", "info", "kind", "ok"], n, replace=False)
    props = {str(k): _value(rng, depth) for k in names}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _value(rng: np.random.Generator, depth: int) -> dict[str, Any]:
    kinds = ["string", "integer", "number", "boolean", "enum", "array"] + (["object"] if depth < 2 else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "string":
        return {"type": "string", "maxLength": int(rng.integers(3, 16))}
    if kind == "integer":
        lo = int(rng.integers(-100, 100))
        return {"type": "integer", "minimum": lo, "maximum": lo + int(rng.integers(1, 1000))}
    if kind == "number":
        lo = float(rng.integers(-10, 10))
        return {"type": "number", "minimum": lo, "maximum": lo + float(rng.integers(1, 100))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": [str(w) for w in rng.choice(WORDS, int(rng.integers(2, 5)), replace=False)]}
    if kind == "array":
        item = _value(rng, 2) if depth < 2 else {"type": "integer", "minimum": 0, "maximum": 9}
        if item.get("type") in ("array", "object"):
            item = {"type": "boolean"}
        return {"type": "array", "items": item, "minItems": 1, "maxItems": int(rng.integers(1, 4))}
    return random_schema(rng, depth + 1)
