"""POST /slots/{name}?action=save|restore|erase: llama.cpp server's slot save and restore, on
the disk prefix cache (engine/disk_prefix.py). edge-infer has no fixed slots, so the path names
a saved conversation prefix instead of a slot id:

- save: the body's `prompt` (text) or `messages` (rendered by the chat template,
  no generation prompt) is computed where it is not cached already and its full KV blocks are
  written to disk now, under the name; {"id_slot": name, "filename": name, "n_saved": tokens,
  "n_written": bytes, "timings": {"save_ms"}}, as llama.cpp answers.
- restore: those blocks go into the KV pool as cached blocks, so the next request that starts
  with the prefix computes only the rest; {"n_restored", "n_read", "timings": {"restore_ms"}}.
- erase: the name is forgotten; {"n_erased"}.

It needs the model's engine to keep a disk prefix cache (--prefix-cache-dir): a 400 says so.
"""

from __future__ import annotations

import re
import time

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from edge_infer.errors import EdgeInferError
from edge_infer.server.context import parse_request
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.protocol import TokenizeRequest, template_messages
from edge_infer.server.schema import body_schema

router = APIRouter()
ACTIONS = ("save", "restore", "erase")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@router.post("/slots/{name}", openapi_extra=body_schema(TokenizeRequest))
async def slot(name: str, request: Request, action: str | None = None) -> Response:
    if action not in ACTIONS:
        raise APIError(400, f"action must be one of {', '.join(ACTIONS)} (?action=save), got {action!r}",
                       param="action", code="invalid_value")
    if not NAME.match(name):
        raise APIError(400, "the name in /slots/{name} must be 1-64 letters, digits, '.', '_' or '-', starting "
                       "with a letter or digit", param="name", code="invalid_value")
    ctx, req = await parse_request(request, TokenizeRequest)
    given = req.prompt is not None or req.messages is not None
    if action == "save" and (req.prompt is None) == (req.messages is None):
        raise APIError(400, "save needs either prompt or messages: the prefix to save", param="prompt",
                       code="invalid_value")
    if action != "save" and given:
        raise APIError(400, f"{action} takes no prompt or messages: the name says which prefix", param="prompt",
                       code="invalid_value")
    if req.add_special_tokens is not None or req.add_generation_prompt is not True:
        raise APIError(400, "add_special_tokens and add_generation_prompt are not used here", param="add_special_tokens",
                       code="unsupported_parameter")
    t0 = time.perf_counter()
    async with ctx.pool.use(req.model, adapters=False) as (engine, _):
        ids: list[int] | None = None
        if action == "save":
            tok = engine.tokenizer
            assert tok is not None
            if req.prompt is not None:
                text = req.prompt
                ids = await engine.run(lambda: tok.encode(text, add_special=True, parse_special=False))
            else:
                chat = await engine.chat_prompt(template_messages(req.messages or []), add_generation_prompt=False)
                if not isinstance(chat, list):
                    raise APIError(400, "messages: a slot is saved from text only (no images)", param="messages",
                                   code="invalid_value")
                ids = chat
        try:
            out = await engine.call(lambda e: e.prefix_slot(action, name, ids))
        except EdgeInferError as e:
            raise from_engine_error(e, {"prompt", "messages"}) from None
    ms = (time.perf_counter() - t0) * 1000
    timing = {"save": "save_ms", "restore": "restore_ms"}.get(action)
    return JSONResponse({"id_slot": name, "filename": name, **out, **({"timings": {timing: ms}} if timing else {})})
