"""LoRA adapters over the HTTP API (issue #43): which adapters a generation runs with, and
llama-server's GET / POST /lora-adapters.

The adapters belong to a served model (`edge-infer serve --lora NAME=FILE[:SCALE]` loads them
over the first model). A request picks them two ways, which combine:

- `model: "<adapter name>"` (vLLM's way): the adapter's model runs it with that adapter at its
  default scale, and the response's `model` is the adapter's name; every generating route
  (completions, chat, Responses, Anthropic's Messages) takes it.
- llama.cpp's request field `lora: [{"id": i, "scale": s}, ...]` (completions and chat only): the
  adapters by their id in GET /lora-adapters, at those scales (0 leaves one out). Each id at most
  once; an entry for the adapter `model` names sets its scale (the entry wins).

A request that names no adapter either way runs the base model.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from edge_infer.errors import EdgeInferError
from edge_infer.server.context import server_context
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.http_guards import authorize, read_body, require_json

if TYPE_CHECKING:
    from edge_infer.engine.lora import AdapterInfo, AdapterRequest
    from edge_infer.server.engine_client import AsyncEngine
    from edge_infer.server.model_pool import ModelPool
    from edge_infer.server.protocol import LoraEntry

router = APIRouter()
PATH = "/lora-adapters"
_SCALES_BODY = {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                           "scale": {"type": "number"}},
                                           "required": ["id", "scale"], "additionalProperties": False}}


def model_lora(pool: ModelPool, served: str) -> AdapterRequest:
    """The adapter a request's served model name picks (its default scale), or () for a model."""
    adapter = pool.adapter(served)
    return ((adapter, None),) if adapter is not None else ()


async def request_lora(engine: AsyncEngine, pool: ModelPool, served: str,
                       entries: list[LoraEntry] | None) -> AdapterRequest:
    """The adapters a completions or chat request runs with: the one its `model` names (at its
    default scale) and llama.cpp's `lora` entries by id, each at its scale; an entry for the
    model's adapter wins over its default. A 400 names the entry at fault: an id listed twice,
    one no adapter has, a scale that is not finite."""
    named = model_lora(pool, served)
    if not entries:
        return named
    seen: set[int] = set()
    for i, e in enumerate(entries):
        if e.id in seen:
            raise APIError(400, f"lora[{i}].id: adapter id {e.id} is listed twice (give each adapter once, with "
                           "its scale)", param=f"lora[{i}].id", code="invalid_value")
        seen.add(e.id)
        if not math.isfinite(e.scale):
            raise APIError(400, f"lora[{i}].scale must be a finite number, got {e.scale!r}", param=f"lora[{i}].scale",
                           code="invalid_value")
    names = {a.id: a.name for a in await adapter_infos(engine)}
    out: list[tuple[str, float | None]] = []
    for i, e in enumerate(entries):
        if e.id not in names:
            raise APIError(400, f"lora[{i}].id: no LoRA adapter has id {e.id} ({_known(names)}; GET {PATH} "
                           "lists them)", param=f"lora[{i}].id", code="invalid_value")
        out.append((names[e.id], e.scale))
    listed = {name for name, _ in out}
    return tuple(a for a in named if a[0] not in listed) + tuple(out)


async def adapter_infos(engine: AsyncEngine) -> list[AdapterInfo]:
    """The adapters loaded over the engine's model (an encoder has none), from the engine thread."""
    infos: list[AdapterInfo] = await engine.call(lambda e: e.loras.infos() if hasattr(e, "loras") else [])
    return infos


@router.get(PATH)
async def list_adapters(request: Request, model: str | None = None) -> Response:
    """llama-server's GET /lora-adapters: [{"id", "path", "scale", "name"}] of the first model
    (or ?model=NAME's); scale is each adapter's default scale."""
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys)
    ctx.check_serving()
    async with ctx.pool.use(model) as (engine, _):
        return JSONResponse(_listing(await adapter_infos(engine)))


@router.post(PATH, openapi_extra={"requestBody": {"required": True,
                                                  "content": {"application/json": {"schema": _SCALES_BODY}}}})
async def set_adapter_scales(request: Request, model: str | None = None) -> Response:
    """llama-server's POST /lora-adapters: a body [{"id": i, "scale": s}, ...] sets those
    adapters' default scales (the others keep theirs; llama-server sets those to 0) and the
    answer is the new list, as GET's. The one difference in meaning from llama-server: there
    these global scales apply to every request that sends no `lora`; here a request that names
    no adapter runs the base model, and these scales are what an adapter runs at when a request
    names it by `model` (a `lora` entry carries its own scale). On the first model, or
    ?model=NAME's."""
    ctx = server_context(request.app)
    authorize(request, ctx.api_keys)
    require_json(request)
    ctx.check_serving()
    wanted = _scales(await read_body(request, ctx.limits.max_body, ctx.read_timeout))
    async with ctx.pool.use(model) as (engine, _):
        names = {a.id: a.name for a in await adapter_infos(engine)}
        for i, (aid, _) in enumerate(wanted):
            if aid not in names:
                raise APIError(400, f"[{i}].id: no LoRA adapter has id {aid} ({_known(names)})", param=f"[{i}].id",
                               code="invalid_value")
        chosen = [(names[aid], scale) for aid, scale in wanted]

        def apply(e: Any) -> list[AdapterInfo]:
            if not hasattr(e, "loras"):  # an encoder has none (then `chosen` is empty)
                return []
            for name, scale in chosen:
                e.loras.set_scale(name, scale)
            infos: list[AdapterInfo] = e.loras.infos()
            return infos

        try:
            return JSONResponse(_listing(await engine.call(apply)))
        except EdgeInferError as e:  # unloaded meanwhile
            raise from_engine_error(e) from None


def _listing(infos: list[AdapterInfo]) -> list[dict[str, Any]]:
    return [{"id": a.id, "path": a.path, "scale": a.scale, "name": a.name} for a in infos]


def _known(names: dict[int, str]) -> str:
    if not names:
        return "no adapter is loaded: start the server with --lora NAME=FILE"
    return "the ids are " + ", ".join(f"{i} ({n})" for i, n in sorted(names.items()))


def _scales(raw: bytes) -> list[tuple[int, float]]:
    """POST /lora-adapters' body as (id, scale) pairs; a 400 names what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise APIError(400, f"the body must be JSON: [{{\"id\": 0, \"scale\": 0.5}}, ...] ({e})",
                       code="invalid_json") from None
    if not isinstance(data, list):
        raise APIError(400, f"the body must be a list of {{\"id\", \"scale\"}} objects, got {type(data).__name__}",
                       code="invalid_type")
    out: list[tuple[int, float]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or set(item) != {"id", "scale"}:
            raise APIError(400, f"[{i}] must be an object with exactly id and scale, got {_shown(item)}",
                           param=f"[{i}]", code="invalid_value")
        aid, scale = item["id"], item["scale"]
        if isinstance(aid, bool) or not isinstance(aid, int):
            raise APIError(400, f"[{i}].id must be an integer (an id from GET {PATH}), got {_shown(aid)}",
                           param=f"[{i}].id", code="invalid_type")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise APIError(400, f"[{i}].scale must be a finite number, got {_shown(scale)}",
                           param=f"[{i}].scale", code="invalid_type")
        if any(aid == seen for seen, _ in out):
            raise APIError(400, f"[{i}].id: adapter id {aid} is listed twice", param=f"[{i}].id", code="invalid_value")
        out.append((aid, float(scale)))
    return out


def _shown(v: object) -> str:
    """A body value in an error message: a scalar as JSON, anything else by its kind."""
    return json.dumps(v)[:40] if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")
