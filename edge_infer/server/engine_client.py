"""AsyncEngine: the event loop's side of the one engine thread.

The model loads in the background (the server answers /health with 503 meanwhile). Each
engine request becomes a `Stream` whose outputs the engine thread hands to the loop with
call_soon_threadsafe; a stream that is dropped (client gone, shutdown) aborts its request,
which frees its KV blocks before the engine's next step. Admission control caps the sequences
in flight (each prompt's n samples, as vLLM's scheduler counts them against max_num_seqs) at
max_num_seqs running + max_queue waiting: beyond that a 429, and a request that alone needs
more (prompts x n) a 400, since retrying it could never succeed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any

from edge_infer._version import __version__
from edge_infer.chat.content_parts import media_marker, split_parts
from edge_infer.config import EngineConfig
from edge_infer.engine.image_prompt import MultimodalPrompt
from edge_infer.errors import ChatTemplateError, EdgeInferError, GenerationError, InvalidRequest
from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams
from edge_infer.server.daemon_pool import DaemonPool
from edge_infer.server.errors import APIError, from_engine_error
from edge_infer.server.harmony import is_harmony
from edge_infer.server.metrics import ServerMetrics
from edge_infer.server.reasoning import OPEN, thinks
from edge_infer.server.tools import MARKERS, detect_format

if TYPE_CHECKING:
    from edge_infer.chat import ChatTemplate
    from edge_infer.engine.engines import Engine
    from edge_infer.engine.lora import AdapterRequest
    from edge_infer.engine.worker_protocol import Worker
    from edge_infer.formats.gguf import GGUFFile
    from edge_infer.tokenizer import Tokenizer

log = logging.getLogger("edge_infer.server")
# chat template renders: on daemon threads, so that one still running never holds up exit
_RENDERS = DaemonPool(8, "edge-infer-render")

class Stream:
    """The outputs of one engine request, on the event loop. `next()` returns the newest
    cumulative RequestOutput (skipping ones the consumer was too slow to see)."""

    def __init__(self, owner: AsyncEngine, request_id: str, seqs: int = 1) -> None:
        self.owner = owner
        self.request_id = request_id
        self.seqs = seqs  # sequences it holds in the engine (its n)
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.finished = False
        self.created = time.monotonic()
        self.first_token_at: float | None = None
        self._loop = asyncio.get_running_loop()

    def on_output(self, item: RequestOutput | BaseException) -> None:
        """Engine thread: pass the item to the loop."""
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def next(self) -> RequestOutput:
        item = await self.queue.get()
        while isinstance(item, RequestOutput) and not item.finished and not self.queue.empty():
            item = self.queue.get_nowait()  # outputs are cumulative: the newest holds it all
        if isinstance(item, BaseException):
            self._done()
            raise item
        if self.first_token_at is None and any(c.token_ids for c in item.outputs):
            self.first_token_at = time.monotonic()
            self.owner.metrics.ttft.observe(self.first_token_at - self.created)
        if item.finished:
            self._done()
            self.owner.metrics.observe_finished(item, time.monotonic() - self.created)
            failed = next((c for c in item.outputs if c.finish_reason == "error"), None)
            if failed is not None:  # this request's own failure (a 500 for it alone; names only its data)
                raise GenerationError(failed.error or "generation failed")
        return item

    async def final(self) -> RequestOutput:
        while True:
            out = await self.next()
            if out.finished:
                return out

    def abort(self) -> None:
        """Stop the request now (no-op once it has finished)."""
        if not self.finished:
            self._done()
            self.owner.metrics.aborted += 1
            if self.owner.worker is not None:
                self.owner.worker.abort(self.request_id)

    def _done(self) -> None:
        self.finished = True
        self.owner.in_flight.pop(self.request_id, None)


class AsyncEngine:
    """One Worker (the engine thread here; ClusterEngine's remote one) behind an asyncio front:
    loading, admission, submit, abort, drain."""

    def __init__(
        self, config: EngineConfig, *, max_queue: int = 256, chat_fallback: str | None = None
    ) -> None:
        self.config = config
        self.max_queue = max_queue
        self.chat_fallback = chat_fallback
        self.state = "loading"  # -> "ready" | "failed"; -> "draining" on shutdown
        self.error: str | None = None
        self.worker: Worker | None = None
        self.tokenizer: Tokenizer | None = None
        self.max_model_len = 0
        self.chat_template: ChatTemplate | None = None
        self.chat_stops: tuple[str, ...] = ()
        self.chat_error: str | None = None
        self.in_flight: dict[str, Stream] = {}
        self.metrics = ServerMetrics()
        self.load_seconds: float | None = None
        self.fingerprint = f"edge-infer-{__version__}"
        # the server's --reasoning-budget: tokens of <think> before it is closed (None: no limit)
        self.reasoning_budget: int | None = None
        self.allow_image_urls = False  # --allow-image-urls: image_url parts may name http(s) URLs
        # submit() waits for the engine's next step boundary; these threads do that waiting.
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="edge-infer-submit")

    # -- life cycle ------------------------------------------------------------------------------
    async def load(self) -> None:
        """Start the engine thread (loads the model); sets state to "ready" or "failed"."""
        t0 = time.perf_counter()
        try:
            worker = await asyncio.get_running_loop().run_in_executor(self._pool, self._load)
        except Exception as e:
            self.state, self.error = "failed", " ".join(str(e).split()) or type(e).__name__
            raise
        if worker is not None and self.state == "loading":
            self.load_seconds = time.perf_counter() - t0
            self.state = "ready"

    def load_now(self) -> None:
        """load(), on this thread (a Ray Serve replica's constructor: up means loaded)."""
        t0 = time.perf_counter()
        try:
            self._load()
        except Exception as e:
            self.state, self.error = "failed", " ".join(str(e).split()) or type(e).__name__
            raise
        self.load_seconds = time.perf_counter() - t0
        self.state = "ready"

    def _load(self) -> Worker | None:
        """Start the worker; then tokenizer, chat template and context length (None: shut down meanwhile)."""
        from edge_infer.engine.worker import EngineWorker

        worker = EngineWorker(self.config)
        engine = worker.engine
        assert engine is not None
        try:
            self._setup_chat(engine.gguf)
        except BaseException:
            worker.shutdown()
            raise
        if self.state != "loading":  # shut down while loading
            worker.shutdown()
            return None
        self.worker, self.tokenizer, self.max_model_len = worker, engine.tokenizer, engine.plan.max_model_len
        return worker

    def _setup_chat(self, source: GGUFFile | str | os.PathLike[str]) -> None:
        """The chat template (and its stop strings) from the model's GGUF metadata: an opened
        file or its path; without one, the reason /v1/chat/completions gives instead."""
        from edge_infer.chat import BUILTIN_STOPS, ChatTemplate

        try:
            t = ChatTemplate.from_gguf(source, fallback=self.chat_fallback)
        except ChatTemplateError:
            self.chat_error = (
                "this model has no chat template (tokenizer.chat_template), so /v1/chat/completions is "
                "unavailable; use /v1/completions, or restart the server with --chat-template chatml"
            )
            return
        self.chat_template = t
        if t.name.startswith("builtin") and self.chat_fallback:
            self.chat_stops = BUILTIN_STOPS.get(self.chat_fallback, ())

    def begin_drain(self, grace: float) -> None:
        """Refuse new requests; abort those still running after `grace` seconds."""
        if self.state == "draining":
            return
        self.state = "draining"
        log.info("shutting down: %d request(s) in flight, %.1f s to finish", len(self.in_flight), grace)
        asyncio.get_running_loop().call_later(grace, self.abort_all)

    def abort_all(self) -> None:
        for s in list(self.in_flight.values()):
            s.abort()
            s.queue.put_nowait(EdgeInferError("the server is shutting down"))

    async def close(self) -> None:
        self.abort_all()
        if self.worker is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.worker.shutdown)
            self.worker = None
        self._pool.shutdown(wait=False)

    def check_ready(self) -> None:
        if self.state == "loading":
            raise APIError(503, "the model is still loading; retry shortly", code="model_loading",
                           headers={"Retry-After": "1"})
        if self.state == "failed":
            raise APIError(503, f"the model failed to load: {self.error}", code="model_load_failed")
        if self.state == "draining" or self.worker is None:
            raise APIError(503, "the server is shutting down", code="shutting_down")

    # -- requests --------------------------------------------------------------------------------
    async def submit(
        self, prompts: list[str | list[int] | MultimodalPrompt], params: SamplingParams, request_id: str,
        lora: AdapterRequest = (), message_starts: tuple[int, ...] = (),
    ) -> list[Stream]:
        """Queue one engine request per prompt (ids `request_id`, or `request_id-i` for several);
        all or none (an error aborts the others). lora: the LoRA adapters by name and scale (None:
        the adapter's default; routes_lora.py builds it from a request's model and `lora`);
        message_starts: a chat prompt's (chat_starts)."""
        self.check_ready()
        self.admit(len(prompts) * params.n, params.n)
        streams = [Stream(self, f"{request_id}-{i}" if len(prompts) > 1 else request_id, params.n)
                   for i in range(len(prompts))]
        for s in streams:
            self.in_flight[s.request_id] = s
        worker = self.worker
        assert worker is not None
        loop = asyncio.get_running_loop()
        calls = [loop.run_in_executor(self._pool, partial(worker.submit, p, params, s.request_id, on_output=s.on_output,
                                                         lora=lora, message_starts=message_starts))
                 for p, s in zip(prompts, streams)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for s, r in zip(streams, results):
                if isinstance(r, BaseException):
                    s._done()
                else:
                    s.abort()
            e = errors[0]
            if isinstance(e, EdgeInferError):
                raise from_engine_error(e)
            raise e
        return streams

    def admit(self, seqs: int, n: int) -> None:
        """Room for `seqs` more sequences (prompts x n), or a 400 (never fits) / 429 (full now)."""
        limit = self.config.max_num_seqs + self.max_queue
        if seqs > limit:
            field = "n" if n > 1 else "prompt"
            raise APIError(400, f"{field}: {seqs // n} prompt(s) x n={n} is {seqs} sequences, over this server's limit "
                           f"of {limit} sequences in flight", param=field, code="limit_exceeded")
        busy = sum(s.seqs for s in self.in_flight.values())
        if busy + seqs > limit:
            self.metrics.rejected += 1
            raise APIError(429, f"the server is at capacity ({busy} sequences in flight, limit {limit}); retry later",
                           code="queue_full", headers={"Retry-After": "1"})

    async def run(self, fn: Callable[[], Any]) -> Any:
        """fn() on a helper thread (tokenizing, templates: work that must not block the loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """fn(engine) on the engine thread between steps."""
        worker = self.worker
        if worker is None:
            raise APIError(503, "the engine is not running", code="shutting_down")
        return await self.run(partial(worker.call, fn))

    @property
    def tool_format(self) -> str | None:
        """The tool-call format of the model's chat template (server/tools.py), if any."""
        return detect_format(self.chat_template.source if self.chat_template is not None else None)

    @property
    def thinks(self) -> bool:
        """Whether the chat template makes the model reason in <think> (server/reasoning.py)."""
        return thinks(self.chat_template.source if self.chat_template is not None else None)

    @property
    def harmony(self) -> bool:
        """Whether the chat template is gpt-oss's harmony format (server/harmony.py)."""
        return is_harmony(self.chat_template.source if self.chat_template is not None else None)

    def thinking_opened(self, prompt: list[int] | MultimodalPrompt) -> bool:
        """Whether a rendered chat prompt ends inside <think> (the reply starts thinking)."""
        tok = self.tokenizer
        return self.thinks and tok is not None and tok.decode(prompt[-16:]).rstrip().endswith(OPEN)

    def special_markers(self) -> dict[str, int]:
        """Tool-call marker texts that are one token of the vocabulary -> that token's id."""
        tok = self.tokenizer
        found = {m: tok.token_id(m) for m in MARKERS} if tok is not None else {}
        return {m: i for m, i in found.items() if i is not None}

    async def chat_prompt(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[Any] | None = None
    ) -> list[int] | MultimodalPrompt:
        """Token ids of a conversation under the model's template (400 when it has none);
        tools: the request's tools, the template's `tools` variable. Messages with image_url
        parts give a MultimodalPrompt (the images read, checked and preprocessed here)."""
        if self.chat_template is None:
            raise APIError(
                400, self.chat_error or "no chat template", param="messages", code="no_chat_template"
            )
        template, tok = self.chat_template, self.tokenizer
        assert tok is not None
        marker = media_marker()
        plain, refs = split_parts(messages, marker)
        try:
            if not refs:
                return await _RENDERS.run(
                    lambda: template.encode(plain, tok, add_generation_prompt=add_generation_prompt, tools=tools or None)
                )
            return await _RENDERS.run(lambda: self._image_prompt(template, plain, refs, marker, add_generation_prompt,
                                                                 tools))
        except EdgeInferError as e:
            raise from_engine_error(e) from None

    async def chat_starts(self, messages: list[dict[str, Any]], prompt: list[int] | MultimodalPrompt,
                          tools: list[Any] | None = None) -> tuple[int, ...]:
        """Where the chat prompt's messages after the first begin (ChatTemplate.message_starts),
        for a context shift that keeps the first message; () unless the server shifts that way
        (--context-shift without --keep) and the prompt has no images."""
        template, tok = self.chat_template, self.tokenizer
        if not self.config.shifts_whole_messages or not isinstance(prompt, list):
            return ()
        assert template is not None and tok is not None
        plain, _ = split_parts(messages, media_marker())
        return await _RENDERS.run(lambda: template.message_starts(plain, tok, prompt, tools=tools or None))

    def _image_prompt(self, template: Any, messages: list[dict[str, Any]], refs: list[Any], marker: str,
                      add_generation_prompt: bool, tools: list[Any] | None) -> MultimodalPrompt:
        worker = self.worker
        engine = getattr(worker, "engine", None)
        if engine is None or getattr(engine, "vision", None) is None:
            raise InvalidRequest("this model takes no images: start the server with --mmproj FILE (the model's "
                                 "multimodal projector)")
        runs = template.encode_runs(messages, self.tokenizer, marker, add_generation_prompt=add_generation_prompt,
                                    tools=tools or None)
        return engine.prepare_images(runs, refs, allow_files=False, allow_urls=self.allow_image_urls)


async def merge(streams: list[Stream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, output) from several streams as they come; ends when all have finished.
    Leaving early aborts the streams that have not finished."""
    if len(streams) == 1:
        s = streams[0]
        try:
            while not s.finished:
                yield 0, await s.next()
        finally:
            s.abort()
        return
    pending = {asyncio.ensure_future(s.next()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                out = task.result()
                yield i, out
                if not out.finished:
                    pending[asyncio.ensure_future(streams[i].next())] = i
    finally:
        for task in pending:
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved, so asyncio does not warn about it
        for s in streams:
            s.abort()
