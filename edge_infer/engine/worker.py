"""EngineWorker: the one thread that runs an engine (an LLMEngine, or an EncoderEngine for an encoder model). Callers on any thread submit requests
and read their outputs from a per-request queue; requests submitted together are batched.
What callers ask reaches the thread as a command (AddRequest, Abort, Call, Stop: frozen
dataclasses, matched between steps). The fronts see it as a `Worker` (worker_protocol.py).

numba's parallel kernels must never run from two threads at once: every engine call happens
on this thread, and the engine threads of several live LLMs in one process take turns through
a process-wide lock (a step, a call or a model load at a time; uncontended it costs nothing).
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, TypeVar

from edge_infer.config import EngineConfig
from edge_infer.engine.engines import Engine, make_engine
from edge_infer.engine.image_prompt import ImageSpan, MultimodalPrompt
from edge_infer.engine.lora import AdapterRequest
from edge_infer.engine.sequence import LogitsProcessor
from edge_infer.errors import EdgeInferError, InvalidRequest
from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams

log = logging.getLogger("edge_infer.engine")
_ids = itertools.count()
KERNEL_LOCK = threading.Lock()  # one engine at a time runs kernels, whatever numba's threading layer
T = TypeVar("T")


class RequestHandle:
    """Outputs of one request as they come: `get()` returns the next RequestOutput (cumulative)
    or raises the error the engine hit; the last output has finished=True. With `on_output`,
    outputs and errors go to that callback instead (called on the engine thread; it must not
    block), e.g. to hand them to an asyncio loop with call_soon_threadsafe."""

    def __init__(self, request_id: str,
                 on_output: Callable[[RequestOutput | BaseException], None] | None = None) -> None:
        self.request_id = request_id
        self.queue: queue.Queue[RequestOutput | BaseException] = queue.Queue()
        self.finished = False
        self.on_output = on_output

    def put(self, item: RequestOutput | BaseException) -> None:
        """Deliver an output or error (engine thread)."""
        if self.on_output is None:
            self.queue.put(item)
            return
        try:
            self.on_output(item)
        except Exception:  # a broken consumer must not take the engine thread down
            log.exception("on_output callback of request %s failed", self.request_id)

    def get(self, timeout: float | None = None) -> RequestOutput:
        item = self.queue.get(timeout=timeout)
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item


# -- the engine thread's commands (the caller builds them; the engine thread matches on them) ----
@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request already tokenized, validated and compiled on the caller's thread."""

    handle: RequestHandle
    text: str | None  # the prompt as text, None for token ids
    ids: list[int]
    params: SamplingParams
    priority: int
    constraints: list[LogitsProcessor] | None  # structured output: one processor per sequence
    images: tuple[ImageSpan, ...] = ()  # a MultimodalPrompt's spans (its ids are `ids`)
    lora: AdapterRequest = ()  # LoRA adapters by name and scale (engine/lora.py)
    message_starts: tuple[int, ...] = ()  # a chat prompt's (ChatTemplate.message_starts)


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Call:
    """Run fn(engine) between steps; its result or exception goes to `result`."""

    fn: Callable[[Engine], Any]
    result: Future[Any]


@dataclass(frozen=True, slots=True)
class Stop:
    """Fail what is in flight and end the thread."""


Command = AddRequest | Abort | Call | Stop


class EngineWorker:
    """The engine thread: a `Worker` (engine/worker_protocol.py) in this process. The engine it
    built is `engine` (None once shut down)."""

    def __init__(self, config: EngineConfig, on_step: Callable[[Engine], None] | None = None) -> None:
        self._commands: queue.Queue[Command] = queue.Queue()
        self._handles: dict[str, RequestHandle] = {}
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._on_step = on_step
        self.engine: Engine | None = None
        self._thread = threading.Thread(target=self._run, args=(config,), name="edge-infer-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    # -- caller side ----------------------------------------------------------------------------
    def submit(self, prompt: str | list[int] | MultimodalPrompt, params: SamplingParams, request_id: str | None = None,
               priority: int = 0,
               on_output: Callable[[RequestOutput | BaseException], None] | None = None,
               lora: AdapterRequest = (), message_starts: tuple[int, ...] = ()) -> RequestHandle:
        """Queue a request. Tokenizing, validation and compiling a structured-output constraint
        happen here, on the caller's thread, and raise at once (InvalidRequest, ...); the engine
        thread only queues the request (and resolves its LoRA adapters: an unknown name fails
        the handle)."""
        engine = self._live()
        images: tuple[ImageSpan, ...] = ()
        if isinstance(prompt, MultimodalPrompt):  # built by prepare_images, images preprocessed
            text, ids = engine.prepare_prompt(prompt.ids, params)
            images = prompt.spans
        else:
            text, ids = engine.prepare_prompt(prompt, params)
        constraints = engine.compile_constraints(params)
        rid = request_id or f"req-{next(_ids)}"
        handle = RequestHandle(rid, on_output)
        if lora:  # unknown names are refused here at once (the engine thread resolves them again)
            loras = getattr(engine, "loras", None)
            if loras is None:
                raise InvalidRequest("this model takes no LoRA adapters (an encoder)")
            loras.choose(lora)
        self._commands.put(AddRequest(handle, text, ids, params, priority, constraints, images, lora, message_starts))
        return handle

    def abort(self, request_id: str) -> None:
        """Abort before the next step: its handle gets an error naming it; unknown ids do nothing."""
        self._commands.put(Abort(request_id))

    def call(self, fn: Callable[[Engine], T]) -> T:
        """Run fn(engine) on the engine thread between steps and return its result."""
        self._live()
        result: Future[T] = Future()
        self._commands.put(Call(fn, result))
        while not wait_futures([result], timeout=0.5).done:
            if not self._thread.is_alive():  # stopped meanwhile: no one is left to answer
                raise EdgeInferError("the engine was shut down")
        return result.result()

    def _live(self) -> Engine:
        if self.engine is None or not self._thread.is_alive():
            raise EdgeInferError("this LLM is closed (close() was called, or its engine stopped)")
        return self.engine

    def shutdown(self) -> None:
        """Stop the engine thread (in-flight requests fail) and drop the engine: its weights,
        KV pool and workspace are freed with it. Idempotent."""
        if self._thread.is_alive():
            self._commands.put(Stop())
            self._thread.join(timeout=30)
        if self.engine is not None:
            self.engine = None
            return_freed_memory()

    # -- engine thread -------------------------------------------------------------------------
    def _run(self, config: EngineConfig) -> None:
        try:
            with KERNEL_LOCK:
                self.engine = make_engine(config)
        except BaseException as e:  # reported to the constructor's caller
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        engine = self.engine
        while True:
            busy = engine.has_unfinished_requests()
            try:
                cmd = self._commands.get(block=not busy)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if isinstance(cmd, Stop):
                    self._fail_all(EdgeInferError("the engine was shut down"))
                    close = getattr(engine, "close", None)  # an LLMEngine's disk prefix cache saves here
                    if close is not None:
                        try:
                            with KERNEL_LOCK:
                                close()
                        except Exception:
                            log.exception("closing the engine failed")
                    return
                with KERNEL_LOCK:
                    self._handle(engine, cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if not engine.has_unfinished_requests():
                continue
            try:
                with KERNEL_LOCK:
                    outs = engine.step()
            except Exception:  # a bug or an exhausted resource: fail what is in flight
                # (a sequence's own failure never gets here: sample_step ends it alone). The
                # callers get a message with no request's data in it; the log has the cause.
                log.exception("engine step failed")
                for rid in list(engine.requests):
                    engine.abort(rid)
                self._fail_all(EdgeInferError("the engine failed a step (an internal error, logged by the server); "
                                              "the requests in flight were aborted"))
                continue
            for out in outs:
                h = self._handles.get(out.request_id)
                if h is not None:
                    h.put(out)
                    if out.finished:
                        del self._handles[out.request_id]
            if self._on_step is not None:
                self._on_step(engine)

    def _handle(self, engine: Engine, cmd: AddRequest | Abort | Call) -> None:
        match cmd:
            case AddRequest():
                rid = cmd.handle.request_id
                try:
                    engine.add_request(rid, None, cmd.params, prompt_token_ids=cmd.ids, prompt_text=cmd.text,
                                       priority=cmd.priority, constraints=cmd.constraints, images=cmd.images,
                                       lora=cmd.lora, message_starts=cmd.message_starts)
                    self._handles[rid] = cmd.handle
                except Exception as e:  # e.g. a duplicate request id: the caller learns from its handle
                    cmd.handle.put(e)
            case Abort(request_id=rid):
                if engine.abort(rid):
                    h = self._handles.pop(rid, None)
                    if h is not None:
                        h.put(EdgeInferError(f"request {rid} was aborted"))
            case Call(fn=fn, result=result):
                try:
                    value = fn(engine)
                except BaseException as e:  # the caller's to handle, raised on its thread
                    result.set_exception(e)
                else:
                    result.set_result(value)

    def _fail_all(self, err: BaseException) -> None:
        for h in self._handles.values():
            h.put(err)
        self._handles.clear()


def return_freed_memory() -> None:
    """Hand the C heap's free pages back to the system after a model is dropped. glibc keeps
    large freed buffers (the KV pool, workspaces, repacked weights) in its arenas once its mmap
    threshold has grown, so a process that creates and drops LLMs would keep growing; trimming
    here returns them (a no-op where the C library is not glibc)."""
    gc.collect()  # the engine's reference cycles, so their buffers are free before the trim
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
