"""Several models behind one server (`edge-infer serve -m A -m B`, `--models-dir`), Ollama's way:
each request's `model` picks one; a model loads on first use, at most `max_loaded` at a time
(the least recently used idle one is unloaded to make room; a request for another model waits
while all are busy), and unloads after its keep-alive of idleness (`--keep-alive`, or the last
request's `keep_alive`: seconds, "5m"-style durations, negative for never, 0 right after).

A model whose file would not fit in the memory available unloads idle ones first, else is a 503
naming the sizes. Loads run on the engine's own thread, so other models' streams go on. A model
is busy while a route holds it (`use`) or it has requests in flight.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from edge_infer.config import EngineConfig
from edge_infer.errors import InvalidRequest
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError

log = logging.getLogger("edge_infer.server")
WAIT_FOR_ROOM = 600.0  # seconds a request waits for a busy model to make room before a 503
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model the server answers to: its name, engine config, other names and file size (bytes;
    0 when unknown, e.g. not pulled yet)."""

    name: str
    config: EngineConfig
    aliases: tuple[str, ...] = ()
    size: int = 0

    @property
    def adapters(self) -> tuple[str, ...]:
        """The names of the LoRA adapters its engine loads at start (--lora): each is also a
        `model` a request may name (vLLM's way), run on this model with that adapter."""
        return tuple(name for name, _, _ in self.config.adapters)


def keep_alive_seconds(value: object, field: str = "keep_alive") -> float | None:
    """Seconds from Ollama's keep_alive (a number of seconds or a duration such as "5m", "1h30m",
    "0"); None for a negative one (never unload). A bad value is a 400 naming `field`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        parts = _DURATION.findall(text)
        if _DURATION.sub("", text) == "" and parts:
            seconds = sum(float(n) * _UNIT[u] for n, u in parts)
        else:
            try:
                seconds = float(text)
            except ValueError:
                raise APIError(400, f"{field} must be seconds or a duration such as \"5m\", \"1h\", \"0\", \"-1\"; got "
                               f"{value!r}", param=field, code="invalid_value") from None
    else:
        raise APIError(400, f"{field} must be seconds or a duration string, got {type(value).__name__}", param=field,
                       code="invalid_type")
    if not math.isfinite(seconds):
        raise APIError(400, f"{field} must be a finite number of seconds, got {value!r}", param=field, code="invalid_value")
    return None if seconds < 0 else seconds


def _check_names(models: tuple[ServedModel, ...]) -> None:
    """Every model name, alias and adapter name picks one thing: an adapter's name may be
    none of the others (InvalidRequest naming the clash)."""
    taken = {n for m in models for n in (m.name, *m.aliases)}
    for m in models:
        for name in m.adapters:
            if name in taken:
                raise InvalidRequest(f"the LoRA adapter name {name!r} is taken already (by a served model or "
                                     "another adapter): give it another, e.g. --lora OTHER=FILE")
            taken.add(name)


class ModelPool:
    """The served models and the engines loaded for them. `primary` (the first model's engine,
    made by create_app) is loaded at start-up; the others on first use."""

    def __init__(self, models: tuple[ServedModel, ...], primary: AsyncEngine, make: Callable[[EngineConfig], AsyncEngine],
                 max_loaded: int = 1, keep_alive: float | None = None, fixed: bool = False) -> None:
        _check_names(models)
        self.models = models
        self.primary = models[0].name
        self.make = make
        self.max_loaded = max(1, max_loaded)
        self.keep_alive = keep_alive  # the server's default (None: forever)
        self.engines: dict[str, AsyncEngine] = {self.primary: primary}
        self.metrics = primary.metrics  # one set of counters for the whole server
        self.leases: dict[str, int] = {}
        self.last_used: dict[str, float] = {self.primary: time.monotonic()}
        self.alive_for: dict[str, float | None] = {}  # a request's keep_alive, per model
        self.loading: dict[str, asyncio.Task[AsyncEngine]] = {}
        self.draining = False
        # fixed: the one engine was made elsewhere (a Ray Serve ingress's replicas) and stays;
        # keep_alive cannot unload what this process could not load again
        self.fixed = fixed
        self._room = asyncio.Lock()

    # -- names --------------------------------------------------------------------------------------
    def resolve(self, name: str | None) -> ServedModel:
        """The model a request's `model` names (None: the first; a LoRA adapter's name: the model
        it belongs to); 404 naming the served ones."""
        if name is None:
            return self.models[0]
        for m in self.models:
            if name == m.name or name in m.aliases or name in m.adapters:
                return m
        served = ", ".join(repr(n) for m in self.models for n in (m.name, *m.adapters))
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served}", param="model",
                       code="model_not_found")

    def adapter(self, name: str | None) -> str | None:
        """`name` when it names a LoRA adapter (rather than a model), else None."""
        return name if name is not None and any(name in m.adapters for m in self.models) else None

    def loaded(self, name: str) -> AsyncEngine | None:
        engine = self.engines.get(name)
        return engine if engine is not None and engine.state == "ready" else None

    def any_engine(self) -> AsyncEngine | None:
        """A loaded (or loading) engine, the first model's if there is one (/health, /metrics)."""
        return self.engines.get(self.primary) or next(iter(self.engines.values()), None)

    # -- use ----------------------------------------------------------------------------------------
    @asynccontextmanager
    async def use(self, name: str | None, keep_alive: object = None,
                  adapters: bool = True) -> AsyncIterator[tuple[AsyncEngine, str]]:
        """(engine, served name) for a request, loaded if need be; busy until the block ends
        (and while its requests are in flight). A LoRA adapter's name gives its model's engine
        and the adapter's name (`adapter(served name)` then says which adapter to run);
        adapters=False: such a name is a 400 (a route that would run the base model only)."""
        if self.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        spec = self.resolve(name)
        adapter = self.adapter(name)
        if adapter is not None and not adapters:
            raise APIError(400, f"model: {adapter!r} is a LoRA adapter of {spec.name!r}, which this route does not "
                           f"apply; name {spec.name!r}", param="model", code="invalid_value")
        if keep_alive is not None:
            if self.fixed:
                raise APIError(400, "keep_alive: this server's model runs on its Ray Serve replicas and stays loaded",
                               param="keep_alive", code="unsupported_parameter")
            self.alive_for[spec.name] = keep_alive_seconds(keep_alive)
        else:  # Ollama's rule: each request sets how long its model stays; none given, the default
            self.alive_for.pop(spec.name, None)
        self.leases[spec.name] = self.leases.get(spec.name, 0) + 1
        try:
            engine = await self._engine(spec)
            self.last_used[spec.name] = time.monotonic()
            yield engine, adapter or spec.name
        finally:
            self.leases[spec.name] -= 1
            self.last_used[spec.name] = time.monotonic()

    async def _engine(self, spec: ServedModel) -> AsyncEngine:
        engine = self.engines.get(spec.name)
        if engine is not None and engine.state != "failed":
            if engine.state == "loading" and spec.name in self.loading:
                return await asyncio.shield(self.loading[spec.name])
            engine.check_ready()
            return engine
        task = self.loading.get(spec.name)
        if task is None:
            task = asyncio.ensure_future(self._load(spec))
            self.loading[spec.name] = task

            def forget(_: asyncio.Future[AsyncEngine], name: str = spec.name) -> None:
                self.loading.pop(name, None)

            task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def load_first(self) -> None:
        """Load the first model (start-up); requests for it wait on this load (a one-model server
        answers 503 meanwhile, before they reach the pool)."""
        engine = self.engines[self.primary]

        async def start() -> AsyncEngine:
            await engine.load()
            return engine

        task = asyncio.ensure_future(start())
        self.loading[self.primary] = task
        try:
            await task
        finally:
            self.loading.pop(self.primary, None)

    async def _load(self, spec: ServedModel) -> AsyncEngine:
        async with self._room:
            await self._make_room(spec)
            engine = self.make(spec.config)
            engine.metrics = self.metrics
            self.engines[spec.name] = engine
        t0 = time.perf_counter()
        try:
            await engine.load()
        except Exception as e:
            self.engines.pop(spec.name, None)
            await engine.close()
            raise APIError(500, f"cannot load the model {spec.name!r}: {engine.error or e}", code="model_load_failed") from None
        log.info("loaded %s in %.2f s (%d model(s) loaded)", spec.name, time.perf_counter() - t0, len(self.engines))
        return engine

    def _busy(self, name: str) -> bool:
        engine = self.engines.get(name)
        return self.leases.get(name, 0) > 0 or (engine is not None and (bool(engine.in_flight) or engine.state == "loading"))

    async def _make_room(self, spec: ServedModel) -> None:
        """Unload idle models (least recently used first) until `spec` fits the count and the
        memory; wait while the loaded ones are busy; 503 when it cannot fit at all."""
        import psutil

        need = int(spec.size * 1.1)  # its file and a margin: the repacked weights are no larger
        deadline = time.monotonic() + WAIT_FOR_ROOM
        while True:
            others = [n for n in self.engines if n != spec.name]
            avail = psutil.virtual_memory().available
            if len(others) < self.max_loaded and need <= avail:
                return
            idle = sorted((n for n in others if not self._busy(n)), key=lambda n: self.last_used.get(n, 0.0))
            if idle:
                await self.unload(idle[0], f"to make room for {spec.name}")
                continue
            if not others:  # nothing left to unload: it cannot fit
                raise APIError(503, f"the model {spec.name!r} needs about {need >> 20} MiB and {avail >> 20} MiB is "
                               "available", code="model_too_large")
            if time.monotonic() > deadline:
                sizes = ", ".join(f"{n} ({self._size(n) >> 20} MiB)" for n in others)
                raise APIError(503, f"cannot load {spec.name!r} ({spec.size >> 20} MiB, {avail >> 20} MiB available): "
                               f"{sizes} loaded and busy (--max-loaded-models {self.max_loaded})", code="models_busy",
                               headers={"Retry-After": "5"})
            await asyncio.sleep(0.05)

    def _size(self, name: str) -> int:
        return next((m.size for m in self.models if m.name == name), 0)

    async def unload(self, name: str, why: str) -> None:
        engine = self.engines.pop(name, None)
        if engine is not None:
            log.info("unloading %s (%s)", name, why)
            await engine.close()

    # -- keep-alive ----------------------------------------------------------------------------------
    async def sweep(self) -> None:
        """Unload the models idle for longer than their keep-alive."""
        now = time.monotonic()
        for name in list(self.engines) if not self.fixed else ():
            alive = self.alive_for.get(name, self.keep_alive)
            if alive is None or self._busy(name):
                continue
            if now - self.last_used.get(name, now) >= alive:
                await self.unload(name, f"idle for {alive:g} s")

    async def run_sweeps(self, every: float = 0.25) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.sweep()
            except Exception:  # a failed close must not stop the keep-alive
                log.exception("keep-alive sweep failed")

    def begin_drain(self, grace: float) -> None:
        self.draining = True
        for engine in self.engines.values():
            engine.begin_drain(grace)

    async def close(self) -> None:
        for name in list(self.engines):
            await self.unload(name, "shutting down")
