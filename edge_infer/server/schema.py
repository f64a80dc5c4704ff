"""OpenAPI request bodies for the routes that parse their JSON themselves."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI requestBody of a route that parses `model` itself (the JSON schema with its
    definitions inlined: a schema nested in the document cannot point at its own $defs; objects
    closed, as the server refuses unknown fields)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.rsplit("/", 1)[1]])
            out = {k: inline(v) for k, v in node.items()}
            if "properties" in out:  # the server refuses fields it does not know (a 400)
                out.setdefault("additionalProperties", False)
            return out
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}
