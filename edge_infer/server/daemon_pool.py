"""A few daemon threads that run blocking work for the event loop (chat template renders).

A render is bounded in time (edge_infer/chat/limits.py), and it still must never keep the
process alive: ThreadPoolExecutor's threads are joined at interpreter exit, so one busy render
would hold up a SIGTERM'd server; these threads are daemons, and the process exits regardless.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DaemonPool:
    """Up to `workers` daemon threads working through one queue (started as work arrives)."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    async def run(self, fn: Callable[[], T]) -> T:
        """fn() on one of the pool's threads; its result or exception, on the caller's loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, loop, fut))
        with self._lock:
            if len(self._threads) < self.workers:
                t = threading.Thread(target=self._work, name=f"{self.name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
        return await fut

    def _work(self) -> None:
        while True:
            fn, loop, fut = self._jobs.get()
            try:
                ok, value = True, fn()
            except BaseException as e:  # handed to the caller, whatever it is
                ok, value = False, e
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, value)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
            del fn, fut, value  # drop references while idle


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # the caller was cancelled (client gone)
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
