"""The model pool's rules without a model (stand-in engines): keep_alive durations, the least
recently used idle model unloaded for room, a busy pool waited on then a 503 naming the loaded
models and their sizes, and a model larger than memory refused by its size."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from edge_infer.config import EngineConfig
from edge_infer.server import model_pool
from edge_infer.server.errors import APIError
from edge_infer.server.metrics import ServerMetrics
from edge_infer.server.model_pool import ModelPool, ServedModel, keep_alive_seconds


class _Engine:
    """What the pool touches of an AsyncEngine."""

    def __init__(self, config: EngineConfig) -> None:
        self.config, self.state, self.in_flight, self.metrics = config, "loading", {}, ServerMetrics()
        self.closed = False

    async def load(self) -> None:
        self.state = "ready"

    async def close(self) -> None:
        self.closed = True

    def check_ready(self) -> None:
        pass


def _pool(sizes: dict[str, int], max_loaded: int) -> tuple[ModelPool, list[_Engine]]:
    made: list[_Engine] = []

    def make(config: EngineConfig) -> Any:
        made.append(_Engine(config))
        return made[-1]

    models = tuple(ServedModel(n, EngineConfig(model=f"{n}.gguf"), (), s) for n, s in sizes.items())
    first = make(models[0].config)
    first.state = "ready"
    return ModelPool(models, first, make, max_loaded), made  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "seconds"), [(30, 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("0", 0.0),
                                                ("-1", None), (-1, None), ("2.5", 2.5), ("500ms", 0.5)])
def test_keep_alive_durations(value: object, seconds: float | None) -> None:
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", True, [1]])
def test_bad_keep_alive_is_a_400(value: object) -> None:
    with pytest.raises(APIError) as e:
        keep_alive_seconds(value)
    assert e.value.status == 400 and e.value.param == "keep_alive"


def test_room_is_made_from_the_least_recently_used_idle_model() -> None:
    async def run() -> None:
        pool, made = _pool({"a": 1, "b": 1, "c": 1}, max_loaded=2)
        async with pool.use("b"):
            pass
        async with pool.use("a"):  # a is now the most recently used
            pass
        async with pool.use("c") as (_, name):
            assert name == "c" and set(pool.engines) == {"a", "c"} and made[1].closed
        with pytest.raises(APIError) as e:
            async with pool.use("d"):
                pass
        assert e.value.status == 404 and "'a', 'b', 'c'" in e.value.message

    asyncio.run(run())


def test_a_busy_pool_is_waited_on_then_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_pool, "WAIT_FOR_ROOM", 0.3)

    async def run() -> None:
        pool, _ = _pool({"a": 5 << 20, "b": 7 << 20}, max_loaded=1)
        async with pool.use("a"):  # a stays busy while b asks for room
            with pytest.raises(APIError) as e:
                async with pool.use("b"):
                    pass
        assert e.value.status == 503 and "a (5 MiB) loaded and busy" in e.value.message
        async with pool.use("b") as (_, name):  # a is idle now: it makes room
            assert name == "b" and set(pool.engines) == {"b"}

    asyncio.run(run())


def test_a_model_larger_than_memory_is_refused_by_its_size() -> None:
    async def run() -> None:
        pool, _ = _pool({"a": 1, "huge": 1 << 60}, max_loaded=3)
        with pytest.raises(APIError) as e:
            async with pool.use("huge"):
                pass
        assert e.value.status == 503 and "needs about" in e.value.message and "MiB is available" in e.value.message
        assert "a" not in pool.engines  # the idle one was unloaded first, and it still did not fit

    asyncio.run(run())


def test_a_fixed_engine_is_never_unloaded() -> None:
    """The Ray Serve ingress's engine (made elsewhere) stays: keep_alive is refused, sweeps pass it."""
    async def run() -> None:
        pool, _ = _pool({"a": 1}, max_loaded=1)
        pool.fixed, pool.keep_alive = True, 0.0
        with pytest.raises(APIError) as e:
            async with pool.use("a", keep_alive=0):
                pass
        assert e.value.param == "keep_alive"
        await pool.sweep()
        assert "a" in pool.engines

    asyncio.run(run())


def test_keep_alive_lasts_until_the_next_request() -> None:
    """Ollama's rule: keep_alive 0 unloads its model after that request; a later request that
    sends none loads it again and keeps it for the server's default (here: forever)."""
    async def run() -> None:
        pool, made = _pool({"a": 1}, max_loaded=1)
        async with pool.use("a", keep_alive=0):
            pass
        await pool.sweep()
        assert "a" not in pool.engines and made[0].closed
        async with pool.use("a"):
            pass
        await pool.sweep()
        assert "a" in pool.engines and len(made) == 2

    asyncio.run(run())
