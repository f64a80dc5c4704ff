"""The engine deployment's replica: one AsyncEngine (one engine thread with `--threads`
threads) serving EngineRequests from the ingress as streams of RequestOutputs."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from edge_infer.cluster.delta import OutputDelta, diff
from edge_infer.cluster.request import EngineRequest
from edge_infer.config import EngineConfig
from edge_infer.outputs import RequestOutput
from edge_infer.server.engine_client import AsyncEngine

# A replica sends a stream's new tokens at most this often (the first output and the last at
# once): one Ray message per step and stream cost the replica and the ingress more CPU than the
# tokens (ray.serve.llm batches its streams the same way).
STREAM_INTERVAL_S = 0.05


def log_to_serve() -> None:
    """Send edge_infer's log records to this replica's Serve log file: Serve gives handlers to
    its own "ray.serve" logger only (and, in its throughput profile, nothing reaches stderr), so
    the full errors the ingress keeps from clients would otherwise be lost."""
    ours = logging.getLogger("edge_infer")
    for h in logging.getLogger("ray.serve").handlers:
        if h not in ours.handlers:
            ours.addHandler(h)


class EngineReplica:
    """What `serve.deployment` wraps (app.py sets its options). Ray calls check_health
    periodically; a replica whose model failed to load is unhealthy and gets replaced."""

    def __init__(self, config: EngineConfig, max_queue: int) -> None:
        log_to_serve()
        self.engine = AsyncEngine(config, max_queue=max_queue)
        self.engine.load_now()  # Serve counts the replica as up once its constructor returns
        self.replica_id = self._replica_id()

    @staticmethod
    def _replica_id() -> str:
        try:
            from ray import serve

            return str(serve.get_replica_context().replica_id.unique_id)
        except Exception:  # outside Serve (tests of this class alone)
            return f"pid-{os.getpid()}"

    async def info(self) -> dict[str, Any]:
        """The replica's id, pid and engine limits (the ingress asks once, at start-up)."""
        return {"replica_id": self.replica_id, "pid": os.getpid(), "max_model_len": self.engine.max_model_len,
                "max_num_seqs": self.engine.config.max_num_seqs}

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput | OutputDelta]:
        """The request's first output, then deltas until it finishes; a
        cancelled stream (client gone) aborts the request and frees its KV blocks."""
        (stream,) = await self.engine.submit([request.prompt], request.params, request.request_id,
                                             message_starts=request.message_starts)
        try:
            prev = await stream.next()
            yield prev  # whole, once; then what the steps since added
            sent = time.monotonic()
            while not stream.finished:
                out = await stream.next()
                wait = STREAM_INTERVAL_S - (time.monotonic() - sent)
                if wait > 0 and not out.finished:
                    await asyncio.sleep(wait)
                    if not stream.queue.empty():
                        out = await stream.next()  # the newest output (next() skips to it)
                yield diff(prev, out)
                prev, sent = out, time.monotonic()
        finally:
            stream.abort()

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(engine) between two steps of this replica's engine (metrics, embeddings)."""
        return await self.engine.call(fn)

    def check_health(self) -> None:
        if self.engine.state != "ready":
            raise RuntimeError(f"engine {self.engine.state}: {self.engine.error or ''}")

    def __del__(self) -> None:
        engine: AsyncEngine | None = getattr(self, "engine", None)  # absent if the constructor failed first
        if engine is not None and engine.worker is not None:
            engine.worker.shutdown()
