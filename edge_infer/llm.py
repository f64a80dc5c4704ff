"""LLM: the offline Python API (generate, stream, chat, prompt_logits) over one engine thread."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from edge_infer.chat.content_parts import media_marker, split_parts
from edge_infer.config import EngineConfig, RuntimePlan
from edge_infer.engine.embedding import cosine_scores
from edge_infer.engine.encoder_engine import EncoderEngine
from edge_infer.engine.image_prompt import MultimodalPrompt
from edge_infer.engine.lora import AdapterInfo, AdapterRequest, adapter_request
from edge_infer.engine.worker import EngineWorker, RequestHandle
from edge_infer.errors import InvalidRequest
from edge_infer.hub import DEFAULT_MODEL
from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams

Message = dict[str, Any]


class LLM:
    """A loaded model. `LLM("smollm2-135m")` takes a known name (pulled on first use) or a .gguf
    path; keyword options are EngineConfig's (n_threads, kv_cache_memory, max_model_len,
    adapters={"name": "lora.gguf"}, ...) and unknown ones are rejected. Calls from several threads are batched on the engine thread.

    Lifetime: `close()` (or leaving a `with LLM(...)` block) stops the engine thread and frees
    the weights and KV pool; an LLM dropped without it is finalized the same way when the
    garbage collector takes it (or at interpreter exit), so dropped LLMs leave no thread and no
    memory behind. Several live LLMs in one process are safe: their steps take turns.
    """

    def __init__(self, model: str = DEFAULT_MODEL, **options: Any) -> None:
        self.config = EngineConfig.from_options(str(model), **options)
        self._worker = EngineWorker(self.config)
        # dropped without close(): the garbage collector (or interpreter exit) stops the engine
        # thread and frees the weights and the KV pool all the same
        self._finalizer = weakref.finalize(self, EngineWorker.shutdown, self._worker)
        engine = self._worker.engine
        assert engine is not None
        self.tokenizer = engine.tokenizer
        self.model_config = engine.model_config
        self.plan: RuntimePlan = engine.plan
        self._chat_template: Any = None

    # -- generation --------------------------------------------------------------------------
    def generate(self, prompts: str | list[int] | MultimodalPrompt | Sequence[str | list[int] | MultimodalPrompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *, adapter: str | Sequence[str] | None = None,
                 adapter_scale: float | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. A prompt is text or a list of token
        ids; params is one SamplingParams for all prompts or one per prompt. adapter: a loaded
        LoRA adapter's name (None: the base model), at adapter_scale (None: its default)."""
        plist = _as_prompt_list(prompts)
        return self._run(plist, _as_params_list(params, len(plist)), adapter_request(adapter, adapter_scale))

    def _run(self, prompts: list[str | list[int] | MultimodalPrompt], params: list[SamplingParams], lora: AdapterRequest,
             starts: list[tuple[int, ...]] | None = None) -> list[RequestOutput]:
        handles = []
        try:
            for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
                handles.append(self._worker.submit(p, sp, lora=lora, message_starts=starts[i] if starts else ()))
            return [self._wait(h) for h in handles]
        except BaseException:
            for h in handles:
                if not h.finished:
                    self._worker.abort(h.request_id)
            raise

    def stream(self, prompt: str | list[int] | MultimodalPrompt, params: SamplingParams | None = None, *,
               final: list[RequestOutput] | None = None, adapter: str | Sequence[str] | None = None,
               adapter_scale: float | None = None) -> Iterator[str]:
        """Text deltas of one completion as they are generated (sample 0 when n > 1). The last
        RequestOutput is appended to `final` when a list is given. Closing the iterator early
        (or Ctrl-C) aborts the request in the engine. adapter, adapter_scale: as generate's."""
        handle = self._worker.submit(prompt, params or SamplingParams(), lora=adapter_request(adapter, adapter_scale))
        return self._deltas(handle, final)

    def _deltas(self, handle: RequestHandle, final: list[RequestOutput] | None) -> Iterator[str]:
        sent = 0
        try:
            while True:
                out = handle.get()
                text = out.outputs[0].text
                if len(text) > sent:
                    yield text[sent:]
                    sent = len(text)
                if out.finished:
                    if final is not None:
                        final.append(out)
                    return
        finally:
            if not handle.finished:
                self._worker.abort(handle.request_id)

    def chat(self, messages: list[Message] | list[list[Message]], params: SamplingParams | None = None,
             *, add_generation_prompt: bool = True, adapter: str | Sequence[str] | None = None,
             adapter_scale: float | None = None) -> list[RequestOutput]:
        """Generate replies with the model's chat template; one output per conversation
        (adapter, adapter_scale: as generate's)."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        if not convs:
            raise InvalidRequest("chat() needs at least one conversation")
        prompts = [self.chat_prompt(c, add_generation_prompt=add_generation_prompt) for c in convs]  # type: ignore[arg-type]
        starts = [self._chat_template.message_starts(split_parts(c, media_marker())[0], self.tokenizer, p)  # type: ignore[arg-type]
                  if self.config.shifts_whole_messages and isinstance(p, list) else () for c, p in zip(convs, prompts)]
        return self._run(list(prompts), _as_params_list(params, len(prompts)), adapter_request(adapter, adapter_scale),
                         starts)

    def chat_prompt(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int] | MultimodalPrompt:
        """Token ids of a conversation rendered with the model's template (special tokens come
        only from the template, never from message text). A message's content may be a list of
        parts: {"type": "text", "text": ...}, {"type": "image_url", "image_url": {"url": ...}}
        (a data: URL, an http(s) URL or a path) or {"type": "image", "image": path | bytes |
        uint8 [H, W, 3]}; with images the prompt is a MultimodalPrompt (needs an mmproj)."""
        if self._chat_template is None:
            from edge_infer.chat import ChatTemplate

            self._chat_template = ChatTemplate.from_gguf(self._worker.call(lambda e: e.gguf))
        marker = media_marker()
        plain, refs = split_parts(messages, marker)
        if not refs:
            return self._chat_template.encode(plain, self.tokenizer, add_generation_prompt=add_generation_prompt)
        runs = self._chat_template.encode_runs(plain, self.tokenizer, marker, add_generation_prompt=add_generation_prompt)
        return self.images_prompt(runs, refs)

    def images_prompt(self, runs: list[list[int]], refs: Sequence[Any]) -> MultimodalPrompt:
        """The prompt of token runs around images (runs[i] before refs[i]: paths, URLs, bytes or
        uint8 [H, W, 3] arrays), read, checked and preprocessed here."""
        engine = self._worker.engine
        assert engine is not None
        return engine.prepare_images(runs, list(refs))

    def embed(self, texts: str | Sequence[str | list[int]]) -> np.ndarray:
        """Unit-norm embeddings float32 [n, width] of texts (or token-id lists), pooled as the
        file's pooling_type says (decoder models: the last token), batched through the engine."""
        items = [texts] if isinstance(texts, str) else list(texts)
        if not items:
            raise InvalidRequest("embed needs at least one input")
        engine = self._worker.engine
        assert engine is not None
        ids = [engine.embed_ids(t) for t in items]  # tokenized here, off the engine thread
        return self._worker.call(lambda e: e.embed(ids))

    def rerank(self, query: str, documents: Sequence[str]) -> list[float]:
        """A relevance score per document, in input order (higher: more relevant). A reranker
        (pooling_type rank: a cross-encoder) scores each (query, document) pair with its
        classification head; any other embedding model gives the cosine of the query's and the
        document's embeddings."""
        if not isinstance(query, str):
            raise InvalidRequest(f"query must be a string, got {type(query).__name__}")
        docs = list(documents) if not isinstance(documents, str) else [documents]
        if not docs:
            raise InvalidRequest("rerank needs at least one document")
        for d in docs:
            if not isinstance(d, str):
                raise InvalidRequest(f"each document must be a string, got {type(d).__name__}")
        engine = self._worker.engine
        assert engine is not None
        # tokenized here, off the engine thread
        if isinstance(engine, EncoderEngine) and engine.rerank_method == "rank":
            pairs = [engine.rerank_ids(query, d) for d in docs]
            scores = self._worker.call(lambda e: e.score_pairs(pairs))  # type: ignore[union-attr]
        else:
            ids = [engine.embed_ids(query)] + [engine.embed_ids(d) for d in docs]
            scores = cosine_scores(self._worker.call(lambda e: e.embed(ids)))
        return [float(s) for s in scores]

    def prompt_logits(self, token_ids: Sequence[int] | MultimodalPrompt, *, adapter: str | Sequence[str] | None = None,
                      adapter_scale: float | None = None) -> np.ndarray:
        """Teacher-forced logits float32 [len(token_ids), vocab]: row i predicts token i + 1 (a
        MultimodalPrompt: its images' embeddings at their positions; adapter, adapter_scale: as
        generate's)."""
        ids = token_ids if isinstance(token_ids, MultimodalPrompt) else list(token_ids)
        lora = adapter_request(adapter, adapter_scale)
        return self._worker.call(lambda e: e.score(ids, lora))

    # -- LoRA adapters -----------------------------------------------------------------------
    def load_adapter(self, name: str, path: str, scale: float = 1.0) -> AdapterInfo:
        """Load llama.cpp's LoRA adapter GGUF at `path` over this model as `name`, with `scale`
        its default; refused by name when it was made for another base."""
        return self._worker.call(lambda e: e.load_adapter(name, path, scale))

    def unload_adapter(self, name: str) -> None:
        """Free adapter `name` (refused while a running request uses it)."""
        self._worker.call(lambda e: e.unload_adapter(name))

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters: slot id, name, path, default scale, alpha, ranks, bytes."""
        return self._worker.call(lambda e: e.loras.infos() if hasattr(e, "loras") else [])

    def image_prompt(self, text: str, images: Sequence[Any], marker: str = "<__media__>") -> MultimodalPrompt:
        """A raw prompt with images: `text` holds `marker` once per image (libmtmd's default
        marker), the text between markers tokenized apart (special tokens parsed, as mtmd
        does; BOS per the model); images: paths, URLs, bytes or uint8 [H, W, 3] arrays."""
        parts = text.split(marker)
        if len(parts) != len(images) + 1:
            raise InvalidRequest(f"the prompt has {len(parts) - 1} image markers ({marker}) for {len(images)} images")
        return self.images_prompt([self.tokenizer.encode(p, add_special=i == 0, parse_special=True)
                                   for i, p in enumerate(parts)], images)

    def _wait(self, handle: RequestHandle) -> RequestOutput:
        while True:
            out = handle.get()
            if out.finished:
                return out

    # -- engine access -----------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        return self._worker.call(lambda e: e.metrics())

    @property
    def worker(self) -> EngineWorker:
        return self._worker

    def close(self) -> None:
        """Stop the engine thread and free the model (weights, KV pool); also what happens when
        an LLM is garbage-collected or the interpreter exits. Calling it again does nothing."""
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_prompt_list(prompts: Any) -> list[str | list[int] | MultimodalPrompt]:
    if isinstance(prompts, (str, MultimodalPrompt)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, (int, np.integer)) for t in prompts):
        return [list(prompts)]
    if isinstance(prompts, (list, tuple)) and prompts:
        for p in prompts:
            if not isinstance(p, (str, list, tuple, MultimodalPrompt)):
                raise InvalidRequest(f"each prompt must be a string or a list of token ids, got {type(p).__name__}")
        return [p if isinstance(p, (str, MultimodalPrompt)) else list(p) for p in prompts]
    raise InvalidRequest("prompts must be a string, a list of token ids, or a non-empty list of those")


def _as_params_list(params: Any, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (list, tuple)):
        if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
            raise InvalidRequest(f"params must be one SamplingParams or a list of {n} (one per prompt)")
        return list(params)
    raise InvalidRequest(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")
