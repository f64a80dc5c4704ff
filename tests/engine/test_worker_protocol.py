"""The Worker seam (issue #34): the local engine thread and the cluster's RemoteWorker both
satisfy engine/worker_protocol.py's Worker, checked statically (`_as_worker` is typed, so mypy
checks each call) and at run time; the engine thread's commands are frozen dataclasses, and
what it does with them (add, abort, call, stop) is seen through the protocol's methods. The
remote worker runs over a stand-in for the deployment's handle (no Ray)."""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine
from edge_infer.engine.worker import Abort, EngineWorker, Stop
from edge_infer.engine.worker_protocol import Worker
from edge_infer.errors import EdgeInferError
from edge_infer.outputs import CompletionOutput, RequestOutput
from edge_infer.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _as_worker(w: Worker) -> Worker:
    """Typed as the protocol: mypy checks each argument against it."""
    assert isinstance(w, Worker)  # and at run time (runtime_checkable: the members are there)
    return w


# After each step the engine thread waits for this (open unless a test holds it between steps).
STEP_GATE = threading.Event()


def _after_step(_: LLMEngine) -> None:
    STEP_GATE.wait(30)


@pytest.fixture(scope="module")
def local(tiny_llama_path: Path) -> Iterator[EngineWorker]:
    STEP_GATE.set()
    config = EngineConfig.from_options(str(tiny_llama_path), n_threads=1, kv_cache_memory="8MiB")
    w = EngineWorker(config, on_step=_after_step)
    yield w
    STEP_GATE.set()
    w.shutdown()


# -- a stand-in for the engine deployment's handle -----------------------------------------------
def _output(rid: str, tokens: list[int], finished: bool) -> RequestOutput:
    return RequestOutput(rid, None, [1, 2, 3], [CompletionOutput(0, "", tokens)], finished=finished)


class _Stream:
    """What `handle.options(stream=True).generate.remote(request)` returns: the outputs, then
    (held) nothing until cancelled."""

    def __init__(self, outs: list[RequestOutput], hold: bool) -> None:
        self.outs, self.hold, self.cancelled = outs, hold, False

    async def _items(self) -> AsyncIterator[RequestOutput]:
        for o in self.outs:
            yield o
        if self.hold:
            await asyncio.Event().wait()

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._items()

    def cancel(self) -> None:
        self.cancelled = True


class _Deployment:
    def __init__(self) -> None:
        self.streams: dict[str, _Stream] = {}
        self.generate = SimpleNamespace(remote=self._generate)
        self.call = SimpleNamespace(remote=self._call)
        self.engine = SimpleNamespace(model_config="replica-config")  # what fn(engine) sees

    def options(self, **_: Any) -> _Deployment:
        return self

    def _generate(self, request: Any) -> _Stream:
        rid = request.request_id
        hold = rid.startswith("hold")
        outs = [_output(rid, [7], False)] if hold else [_output(rid, [7], False), _output(rid, [7, 8], True)]
        self.streams[rid] = _Stream(outs, hold)
        return self.streams[rid]

    async def _call(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.engine)


# -- both satisfy the protocol -------------------------------------------------------------------
def test_both_workers_are_workers(local: EngineWorker) -> None:
    pytest.importorskip("fastapi")
    from edge_infer.cluster.client import RemoteWorker

    assert _as_worker(local).engine is local.engine is not None

    async def main() -> None:
        remote = RemoteWorker(_Deployment(), asyncio.get_running_loop())
        assert _as_worker(remote).engine is None  # its engine is on a replica
    asyncio.run(main())
    assert not isinstance(object(), Worker)


def test_commands_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Abort("r").request_id = "s"  # type: ignore[misc]
    assert Stop() == Stop()


# -- the local worker (the engine thread) --------------------------------------------------------
def test_local_call_returns_or_raises_on_the_callers_thread(local: EngineWorker) -> None:
    w = _as_worker(local)
    assert w.call(lambda e: e is local.engine)
    err = ValueError("from fn")

    def fail(e: LLMEngine) -> None:
        raise err

    with pytest.raises(ValueError) as ei:
        w.call(fail)
    assert ei.value is err
    # fn's own TimeoutError is fn's result, never taken for the caller's wait running out
    with pytest.raises(TimeoutError, match="mine"):
        w.call(partial(_raise, TimeoutError("mine")))


def _raise(exc: BaseException, _: LLMEngine) -> None:
    raise exc


def test_local_submit_delivers_to_on_output_and_abort_ignores_unknown_ids(local: EngineWorker) -> None:
    w = _as_worker(local)
    got: queue.Queue[RequestOutput | BaseException] = queue.Queue()
    handle = w.submit([1, 2, 3], GREEDY, "rid-1", on_output=got.put)
    assert handle is not None and handle.request_id == "rid-1"
    outs: list[RequestOutput] = []
    while not outs or not outs[-1].finished:
        item = got.get(timeout=60)
        assert isinstance(item, RequestOutput), item
        outs.append(item)
    assert outs[-1].request_id == "rid-1" and len(outs[-1].outputs[0].token_ids) == 4
    assert handle.queue.empty()  # with on_output, nothing goes to the handle's own queue
    w.abort("no-such-request")
    assert w.call(lambda e: not e.has_unfinished_requests())


def test_local_abort_fails_the_request_by_name(local: EngineWorker) -> None:
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    STEP_GATE.clear()  # the engine thread waits after its first step, so the abort lands mid-request
    try:
        handle = local.submit([1, 2, 3], long, "rid-abort")
        first = handle.get(timeout=60)
        assert not first.finished
        local.abort("rid-abort")
    finally:
        STEP_GATE.set()
    with pytest.raises(EdgeInferError, match="rid-abort was aborted"):
        while True:
            handle.get(timeout=60)


def test_local_shutdown_stops_and_refuses(tiny_llama_path: Path) -> None:
    w = _as_worker(EngineWorker(EngineConfig.from_options(str(tiny_llama_path), n_threads=1, kv_cache_memory="8MiB")))
    w.shutdown()
    w.shutdown()  # again: nothing
    assert w.engine is None
    with pytest.raises(EdgeInferError, match="closed"):
        w.call(lambda e: 1)
    with pytest.raises(EdgeInferError, match="closed"):
        w.submit([1, 2, 3], GREEDY, "late", on_output=lambda _: None)


# -- the remote worker, over the stand-in ---------------------------------------------------------
def test_remote_worker_streams_aborts_and_calls() -> None:
    pytest.importorskip("fastapi")
    from edge_infer.cluster.client import RemoteWorker

    async def main() -> None:
        loop = asyncio.get_running_loop()
        dep = _Deployment()
        remote = RemoteWorker(dep, loop)
        w = _as_worker(remote)
        got: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()  # on_output runs on the loop

        def submit(rid: str) -> Any:
            return w.submit([1, 2, 3], GREEDY, rid, on_output=got.put_nowait)

        assert await loop.run_in_executor(None, submit, "r1") is None  # outputs come only to on_output
        first, last = await got.get(), await got.get()
        assert isinstance(first, RequestOutput) and isinstance(last, RequestOutput)
        assert (first.finished, last.finished, last.outputs[0].token_ids) == (False, True, [7, 8])

        await loop.run_in_executor(None, submit, "hold-1")
        assert isinstance(await got.get(), RequestOutput)
        await loop.run_in_executor(None, w.abort, "hold-1")
        for _ in range(100):
            if dep.streams["hold-1"].cancelled:
                break
            await asyncio.sleep(0.01)
        assert dep.streams["hold-1"].cancelled  # the replica's generator is told to end
        assert not remote.tasks

        with pytest.raises(EdgeInferError, match="text prompt"):
            w.submit("text", GREEDY, "r2", on_output=got.put_nowait)
        assert await loop.run_in_executor(None, w.call, lambda e: e.model_config) == "replica-config"
        with pytest.raises(EdgeInferError, match="block the event loop"):
            w.call(lambda e: e.model_config)  # on the loop's own thread it would wait for itself

    asyncio.run(main())
