"""Worker: what the fronts (the server's AsyncEngine, the cluster's ingress) need from the thing
that runs their requests. Two satisfy it: `EngineWorker` (engine/worker.py, the engine thread in
this process) and the cluster's `RemoteWorker` (its requests run on engine replicas elsewhere).

It names only what those callers use, so a new worker kind is a class with these members, not
a subclass: the outputs come back through `on_output`, on the worker's own thread (the engine
thread, or the ingress's event loop), never through a return value both kinds could not give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams

if TYPE_CHECKING:
    from edge_infer.engine.engines import Engine
    from edge_infer.engine.image_prompt import MultimodalPrompt
    from edge_infer.engine.lora import AdapterRequest
    from edge_infer.engine.worker import RequestHandle

T = TypeVar("T")
# Receives each cumulative RequestOutput of one request (the last has finished=True), or the
# error that ended it. Called on the worker's thread: it must not block.
OnOutput = Callable[[RequestOutput | BaseException], None]


@runtime_checkable
class Worker(Protocol):
    """Runs requests for a front: submit, abort, call and shutdown may be called from any thread
    but the one the worker delivers on (the remote worker's event loop)."""

    @property
    def engine(self) -> Engine | None:
        """The engine in this process, for what any thread may read (tokenizing, the model's
        config); None when it runs elsewhere (a cluster replica) or has stopped."""
        ...

    def submit(self, prompt: str | list[int] | MultimodalPrompt, params: SamplingParams, request_id: str, *,
               on_output: OnOutput, lora: AdapterRequest = (), message_starts: tuple[int, ...] = ()
               ) -> RequestHandle | None:
        """Queue one request; its outputs go to `on_output`. Raises at once what can be refused
        before it runs (InvalidRequest, ...). The local worker also returns its handle. lora: the
        LoRA adapters by name and scale (engine/lora.py); message_starts: a chat prompt's
        (ChatTemplate.message_starts, for the context shift)."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request (its KV blocks are freed before the next step); unknown ids are ignored."""
        ...

    def call(self, fn: Callable[[Engine], T]) -> T:
        """fn(engine) between two engine steps, and its result (or its exception, raised here)."""
        ...

    def shutdown(self) -> None:
        """Stop: requests in flight fail or are cancelled. Idempotent."""
        ...
