"""The ingress's engine: ClusterEngine is the plain server's AsyncEngine with the engine thread
replaced by RemoteWorker, which sends each request to the engine deployment and feeds the
replica's outputs to the same Stream objects. Tokenizer and chat template are loaded here
from the GGUF's metadata (no weights), so requests are validated and templated before they
travel, and the router sees token ids."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from edge_infer.cluster.delta import OutputDelta, apply
from edge_infer.cluster.request import EngineRequest
from edge_infer.config import EngineConfig
from edge_infer.engine.image_prompt import MultimodalPrompt
from edge_infer.engine.lora import AdapterRequest
from edge_infer.errors import EdgeInferError, GenerationError, InvalidRequest
from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams
from edge_infer.server.engine_client import AsyncEngine
from edge_infer.server.errors import APIError, from_engine_error

if TYPE_CHECKING:
    from edge_infer.engine.engines import Engine
    from edge_infer.engine.worker_protocol import OnOutput, Worker

log = logging.getLogger("edge_infer.cluster")
CALL_TIMEOUT_S = 120.0  # for calls to one replica (metrics, embeddings, start-up info)
REPLICA_FAILED = "a model replica failed while serving this request; retry (the server log has the details)"
T = TypeVar("T")


def _replica_error(e: BaseException, what: str) -> BaseException:
    """A remote failure as the ingress reports it. The request's own errors as the replica raised
    them (a 4xx, or its generation failing); anything else (a dead or unreachable replica, an
    engine fault) a generic 503 the client may retry: Ray's messages name the replica's pid,
    node address and actor id, which are logged here and never sent to a client."""
    cause = getattr(e, "cause", None)
    err = cause if isinstance(cause, (EdgeInferError, APIError)) else e
    if isinstance(err, APIError) and err.status < 500:
        return err
    if isinstance(err, EdgeInferError) and (isinstance(err, GenerationError) or from_engine_error(err).status < 500):
        return err
    log.error("%s: %s: %s", what, type(e).__name__, " ".join(str(e).split()))  # ERROR: Serve flushes its log
    return APIError(503, REPLICA_FAILED, code="replica_failed", headers={"Retry-After": "1"})


async def _call_replica(handle: Any, fn: Callable[[Engine], T]) -> T:
    """fn(engine) on one engine replica (the router's choice), within CALL_TIMEOUT_S."""
    try:
        return await asyncio.wait_for(handle.call.remote(fn), CALL_TIMEOUT_S)
    except Exception as e:
        raise _replica_error(e, "a call to an engine replica") from None


class RemoteWorker:
    """A `Worker` (engine/worker_protocol.py) over the engine deployment's handle: submit() and
    call() are called on helper threads; the streams run on the event loop, which delivers the
    outputs. Its engine is on a replica, so `engine` is None."""

    engine: Engine | None = None

    def __init__(self, handle: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.handle, self.loop = handle, loop
        self.tasks: dict[str, Future[None]] = {}

    def submit(self, prompt: str | list[int] | MultimodalPrompt, params: SamplingParams, request_id: str, *,
               on_output: OnOutput, lora: AdapterRequest = (), message_starts: tuple[int, ...] = ()) -> None:
        if lora:
            raise InvalidRequest("LoRA adapters are not served by Ray Serve replicas yet: serve the model without "
                                 "--replicas")
        if isinstance(prompt, MultimodalPrompt):
            raise InvalidRequest("images are not served by Ray Serve replicas yet: serve the model without --replicas")
        if not isinstance(prompt, list):
            raise EdgeInferError("the cluster ingress sends token ids (a text prompt reached the worker)")
        request = EngineRequest(prompt, params, request_id, message_starts)
        fut = asyncio.run_coroutine_threadsafe(self._pump(request, on_output), self.loop)
        self.tasks[request_id] = fut
        # dropped when it ends (at once if it already has: the loop may finish it before this line)
        fut.add_done_callback(lambda _: self.tasks.pop(request_id, None))

    async def _pump(self, request: EngineRequest, on_output: OnOutput) -> None:
        gen = self.handle.options(stream=True).generate.remote(request)
        last: RequestOutput | None = None
        try:
            async for item in gen:
                last = apply(last, item) if isinstance(item, OutputDelta) and last is not None else item
                on_output(last)
        except asyncio.CancelledError:
            gen.cancel()  # the replica's generator ends, aborting the engine request
            raise
        except Exception as e:
            on_output(_replica_error(e, f"request {request.request_id}"))

    def abort(self, request_id: str) -> None:
        fut = self.tasks.get(request_id)
        if fut is not None:
            self.loop.call_soon_threadsafe(fut.cancel)

    def call(self, fn: Callable[[Engine], T]) -> T:
        """fn(engine) on one replica. It blocks until the replica answers, so never on the event
        loop's thread (ClusterEngine.call awaits the same call there)."""
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # no loop running on this thread
            on_loop = False
        if on_loop:
            raise EdgeInferError("RemoteWorker.call would block the event loop it needs; await ClusterEngine.call")
        return asyncio.run_coroutine_threadsafe(_call_replica(self.handle, fn), self.loop).result()

    def shutdown(self) -> None:
        for fut in list(self.tasks.values()):
            self.loop.call_soon_threadsafe(fut.cancel)


class ClusterEngine(AsyncEngine):
    """AsyncEngine whose requests run on the engine deployment's replicas."""

    def __init__(self, config: EngineConfig, handle: Any, *, max_queue: int = 256,
                 chat_fallback: str | None = None) -> None:
        super().__init__(config, max_queue=max_queue, chat_fallback=chat_fallback)
        self.handle = handle
        self._loop: asyncio.AbstractEventLoop | None = None
        self.replica_info: dict[str, Any] = {}

    async def load(self) -> None:
        """Wait for an engine replica (its limits), then load the tokenizer and template."""
        self._loop = asyncio.get_running_loop()
        try:
            self.replica_info = await asyncio.wait_for(self.handle.info.remote(), CALL_TIMEOUT_S * 5)
        except Exception as e:
            _replica_error(e, "no engine replica came up")
            self.state, self.error = "failed", "no engine replica came up (the server log has the details)"
            raise
        await super().load()

    def _load(self) -> Worker | None:
        """Tokenizer and chat template from the GGUF's metadata (no weights), a RemoteWorker, and
        the context length the replica reported."""
        from edge_infer import hub
        from edge_infer.formats.gguf import GGUFFile
        from edge_infer.tokenizer import Tokenizer

        assert self._loop is not None
        f = GGUFFile(hub.resolve_model(self.config.model))
        self._setup_chat(f)
        tokenizer = Tokenizer.from_gguf(f)
        if self.state != "loading":
            return None
        worker = RemoteWorker(self.handle, self._loop)
        self.worker, self.tokenizer = worker, tokenizer
        self.max_model_len = int(self.replica_info["max_model_len"])
        return worker

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """fn(engine) on one engine replica (the router's choice), awaited on the event loop."""
        if self.worker is None:
            raise APIError(503, "the engine is not running", code="shutting_down")
        return await _call_replica(self.handle, fn)
