"""LLMEngine: requests in, RequestOutputs out, one step at a time: propose -> schedule -> execute
-> sample and verify -> update the scheduler -> outputs.

Not thread-safe by design: exactly one thread (the LLM's or the server's engine thread) calls
it, so numba kernels never run concurrently.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import numpy as np

from edge_infer.config import EngineConfig, SpecConfig
from edge_infer.engine.context_shift import ContextShift
from edge_infer.engine.disk_prefix import open_disk_prefix
from edge_infer.engine.draft import DraftProposer
from edge_infer.engine.embedding import embed as embed_prompts
from edge_infer.engine.image_prompt import ImageSpan, MultimodalPrompt
from edge_infer.engine.loader import LoadedModel, load_model
from edge_infer.engine.lora import AdapterInfo, AdapterRequest, EngineLoras
from edge_infer.engine.ngram import NgramProposer
from edge_infer.engine.output_processor import OutputProcessor
from edge_infer.engine.request import Request
from edge_infer.engine.sample_step import sample_step, whole_rows
from edge_infer.engine.sampler import make_logits_processors, stop_ids, unsatisfiable
from edge_infer.engine.scheduler import SampledTokens
from edge_infer.engine.sequence import LogitsProcessor, Sequence, SequenceStatus
from edge_infer.engine.spec_decode import Proposer, SpecDecoder
from edge_infer.engine.structured import GrammarCompiler
from edge_infer.engine.vision import open_vision
from edge_infer.errors import InvalidRequest, OutOfMemoryBudget
from edge_infer.images.source import load_image
from edge_infer.outputs import RequestMetrics, RequestOutput
from edge_infer.sampling_params import SamplingParams

log = logging.getLogger("edge_infer.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        m: LoadedModel = load_model(config)
        self.model_config, self.tokenizer, self.plan = m.model_config, m.tokenizer, m.plan
        self.runner, self.block_manager, self.scheduler = m.runner, m.block_manager, m.scheduler
        self.prefill = m.prefill  # scoring and embeddings go into the blocks through it
        self.gguf = m.gguf
        self.eos_ids = tuple(sorted(self.tokenizer.stop_ids))
        # llguidance's view of the vocabulary is built on the first constrained request
        self._grammars = GrammarCompiler(self.tokenizer, tuple(self.eos_ids), self.model_config.vocab_size)
        self.spec = self._spec_decoder(config.speculative) if isinstance(config.speculative, SpecConfig) else None
        self.requests: dict[str, Request] = {}
        self.output_processor = OutputProcessor(self.requests, self.eos_ids, self.plan.max_model_len,
                                                config.context_shift)
        self.scheduler.stop_check = self.output_processor.check_stop
        self._rng = np.random.default_rng(config.seed)
        self.stats = {"steps": 0, "prompt_tokens": 0, "generated_tokens": 0, "finished": 0, "aborted": 0}
        self.started = time.monotonic()
        self.disk = open_disk_prefix(config, self.plan, self.model_config, self.block_manager, self.runner)
        self.shift = self._context_shift(config)
        self.vision = open_vision(config.mmproj, self.tokenizer, self.model_config, self.runner)
        if self.vision is not None:
            self.scheduler.images_whole = self.runner.image_noncausal
        self.loras = EngineLoras(self.model_config.arch, self.runner.model)
        for name, path, scale in config.adapters:
            self.loras.load(name, path, scale)

    # -- requests ------------------------------------------------------------------------------
    def prepare_prompt(self, prompt: str | list[int], params: SamplingParams) -> tuple[str | None, list[int]]:
        """Tokenize (text gets BOS per the model) and validate a request: (text or None, ids).
        Reads only what never changes after start, so any thread may call it (the server and
        LLM do, to keep tokenizing off the engine thread)."""
        text: str | None = None
        if isinstance(prompt, str):
            text = prompt
            prompt = self.tokenizer.encode(prompt, add_special=True, parse_special=False)
        elif not isinstance(prompt, (list, tuple)):
            raise InvalidRequest(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        ids = self._check_prompt(list(prompt), params)
        vocab = self.model_config.vocab_size
        for tok in list(params.logit_bias or ()) + list(params.stop_token_ids or ()):
            if not 0 <= tok < vocab:
                raise InvalidRequest(f"token id {tok} in logit_bias/stop_token_ids is outside the vocabulary (0..{vocab - 1})")
        why = unsatisfiable(params, self.eos_ids, vocab)
        if why is not None:
            raise InvalidRequest(why)
        return text, ids

    def prepare_images(self, runs: list[list[int]], refs: list[Any], *, allow_files: bool = True,
                       allow_urls: bool = True) -> MultimodalPrompt:
        """A prompt of token runs around images (runs[i] before refs[i]: what images/source.py's
        load_image reads), the images read, preprocessed and the prompt checked; any thread may
        call it (Pillow's work stays off the engine thread)."""
        if self.vision is None:
            raise InvalidRequest("this model takes no images: load it with an mmproj (--mmproj FILE, "
                                 "LLM(model, mmproj=FILE))")
        images = [load_image(r, f"image {i}", allow_files=allow_files, allow_urls=allow_urls)
                  for i, r in enumerate(refs)]
        prompt = self.vision.prompt(runs, images)
        self._check_prompt(prompt.ids, SamplingParams(max_tokens=None), generates=False)
        return prompt

    def compile_constraints(self, params: SamplingParams) -> list[LogitsProcessor] | None:
        """The request's structured-output processors, one per sequence (None without a
        constraint); InvalidRequest when it does not compile. Any thread may call it: the worker
        compiles on the caller's, so a slow constraint never stalls the engine thread."""
        if params.structured_outputs is None:
            return None
        return self._grammars.processors(params.structured_outputs, params.n)

    def add_request(self, request_id: str, prompt: str | list[int] | None, params: SamplingParams | None = None,
                    *, prompt_token_ids: list[int] | None = None, prompt_text: str | None = None,
                    priority: int = 0, arrival_time: float | None = None,
                    constraints: list[LogitsProcessor] | None = None, images: tuple[ImageSpan, ...] = (),
                    lora: AdapterRequest = (), message_starts: tuple[int, ...] = ()) -> None:
        """Queue a request; `prompt` is text (tokenized with BOS per the model) or token ids, or
        pass prompt_token_ids already checked by prepare_prompt (and prompt_text to echo), and
        constraints from compile_constraints (compiled here when not given); images: the spans of
        a MultimodalPrompt whose ids are prompt_token_ids; lora: the LoRA adapters by name and
        scale (None: the adapter's default); message_starts: a chat prompt's, where its messages
        after the first begin (ChatTemplate.message_starts: the context shift's whole messages)."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise InvalidRequest(f"request id {request_id!r} is already in use")
        if prompt_token_ids is None:
            text, ids = self.prepare_prompt(prompt, params)  # type: ignore[arg-type]
        else:
            text, ids = prompt_text, self._check_prompt(list(prompt_token_ids), params)
        # without max_tokens: until the context is full, or with a context shift until a stop
        unbounded = sys.maxsize if self.shift is not None else self.plan.max_model_len - len(ids)
        max_tokens = params.max_tokens if params.max_tokens is not None else unbounded
        now = time.monotonic() if arrival_time is None else arrival_time
        req = Request(request_id, text, ids, params, max_tokens, RequestMetrics(arrival_time=now))
        processors = make_logits_processors(params, stop_ids(params, self.eos_ids), self.model_config.vocab_size)
        constrained = constraints if constraints is not None else self.compile_constraints(params)
        keys = MultimodalPrompt(ids, images).cache_key_ids() if images else None
        choice = self.loras.choose(lora)
        keys = self.loras.keyed(choice, ids, keys)
        for i in range(params.n):
            seq = Sequence(request_id, ids, params, index=i, priority=priority, images=images, prompt_keys=keys,
                           lora=choice, message_starts=tuple(message_starts))
            seq.rng = self._seq_rng(params, i)
            seq.detok = self.tokenizer.detokenizer(skip_special=params.skip_special_tokens)
            seq.logits_processors = processors + [constrained[i]] if constrained else processors
            req.seqs.append(seq)
        leader = req.seqs[0]
        leader.followers = req.seqs[1:]
        self.requests[request_id] = req
        if self.disk is not None:  # the prompt's blocks saved on disk, into the pool before it is scheduled
            self.disk.fill(keys or ids)
        self.scheduler.add(leader)
        self.stats["prompt_tokens"] += len(ids)

    def _check_prompt(self, ids: list[int], params: SamplingParams, generates: bool = True) -> list[int]:
        if not ids:
            raise InvalidRequest("the prompt is empty (no tokens)")
        vocab = self.model_config.vocab_size
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                raise InvalidRequest(f"prompt token id {t!r} is outside the vocabulary (0..{vocab - 1})")
        ids = [int(t) for t in ids]
        slots = self.block_manager.num_state_slots
        if slots and params.n > slots:
            raise InvalidRequest(f"n={params.n} samples need as many recurrent-state slots, and this hybrid model's "
                                 f"engine has {slots} (raise max_num_seqs)")
        limit = self.plan.max_model_len
        # with a context shift the outputs may go past the context: the prompt must fit
        wanted = len(ids) + ((params.max_tokens if self.shift is None else None) or (1 if generates else 0))
        if wanted > limit:
            what = f"the prompt ({len(ids)} tokens) plus max_tokens ({params.max_tokens})" if params.max_tokens else f"the prompt ({len(ids)} tokens)"
            raise InvalidRequest(f"{what} exceeds the maximum context length of {limit} tokens")
        if self.block_manager.blocks_needed(wanted) > self.block_manager.num_blocks:
            raise OutOfMemoryBudget(
                f"the request needs {wanted} tokens of KV cache but the pool holds {self.plan.kv_capacity_tokens}; "
                "raise kv_cache_memory"
            )
        return ids

    def _seq_rng(self, params: SamplingParams, index: int) -> np.random.Generator:
        if params.seed is not None:
            return np.random.default_rng([params.seed & (2**64 - 1), index])
        return np.random.default_rng(self._rng.integers(2**63))

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; False if it is unknown or already done."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        for seq in req.seqs:
            if not seq.is_finished:
                seq.status = SequenceStatus.FINISHED_ABORTED
            self.scheduler.remove(seq)
            if self.spec is not None:
                self.spec.release(seq)
        self.stats["aborted"] += 1
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine iteration; outputs (cumulative) for every request it advanced."""
        if self.spec is not None:
            self.spec.propose(self.scheduler.running, self._max_tokens_of)
        ended: list[str] = []
        if self.shift is not None:
            for seq in self.shift.apply():  # no room to shift: finished as without it
                self._finish_length(seq)
                ended.append(seq.request_id)
        scheduled = self.scheduler.schedule()
        if not scheduled:  # nothing runnable: hand out what has finished
            return self._outputs([rid for rid, r in self.requests.items() if r.finished])
        self.output_processor.mark_scheduled(scheduled)
        logits = self.runner.execute(scheduled, whole_rows(scheduled.chunks))
        sampled = sample_step(scheduled.chunks, logits, self.spec)
        finished = self.scheduler.update_from_output(scheduled, sampled)
        self._account(sampled, finished)
        return self._outputs(dict.fromkeys([*ended, *(s.seq.request_id for s in sampled)]))

    def _context_shift(self, config: EngineConfig) -> ContextShift | None:
        if not config.context_shift:
            return None
        if self.model_config.recurrent:
            raise InvalidRequest(f"context_shift: {self.model_config.arch} is a hybrid model; a recurrent state "
                                 "cannot drop tokens from its past")
        return ContextShift(config.context_keep, int(self.tokenizer.add_bos), self.plan.max_model_len, self.scheduler,
                            self.runner)

    def _finish_length(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED_LENGTH
        if seq.detok is not None:
            seq.text += seq.detok.flush()
        self.scheduler.remove(seq)
        if self.spec is not None:
            self.spec.release(seq)

    def _max_tokens_of(self, seq: Sequence) -> int:
        return self.requests[seq.request_id].max_tokens

    def _account(self, sampled: list[SampledTokens], finished: list[Sequence]) -> None:
        """Step counters; speculation learns from its verifications and forgets finished sequences."""
        self.stats["steps"] += 1
        self.stats["generated_tokens"] += sum(s.num_emitted for s in sampled)
        if self.spec is not None:
            for s in sampled:
                if s.num_proposed:
                    self.spec.finish(s.seq, s.num_proposed, s.num_accepted, s.num_emitted)
            for seq in finished:
                self.spec.release(seq)

    def _outputs(self, request_ids: list[str] | dict[str, None]) -> list[RequestOutput]:
        outs = self.output_processor.outputs(request_ids)
        self.stats["finished"] += sum(1 for o in outs if o.finished)
        return outs

    def _spec_decoder(self, cfg: SpecConfig) -> SpecDecoder:
        proposer: Proposer
        if cfg.method == "ngram":
            proposer = NgramProposer(cfg.n)
        else:
            assert cfg.model is not None
            proposer = DraftProposer(cfg.model, self.tokenizer, self.plan.n_threads,
                                     max(self.plan.kv_cache_bytes // 4, 16 * 2**20))
        return SpecDecoder(cfg, proposer, self.plan.max_model_len)

    # -- LoRA adapters (engine/lora.py) -----------------------------------------------------------
    def load_adapter(self, name: str, path: str, scale: float = 1.0) -> AdapterInfo:
        """Load a LoRA adapter file over the model as `name` (scale: its default scale)."""
        return self.loras.load(name, path, scale)

    def unload_adapter(self, name: str) -> None:
        """Drop adapter `name` (refused while a running request uses it)."""
        self.loras.unload(name, (s.lora for r in self.requests.values() for s in r.seqs if not s.is_finished))

    # -- teacher-forced scoring ------------------------------------------------------------------
    def score(self, token_ids: list[int] | MultimodalPrompt, lora: AdapterRequest = ()) -> np.ndarray:
        """Logits float32 [len(token_ids), vocab], logits[i] predicting token i + 1 (a
        MultimodalPrompt's image positions take their images' embeddings; lora: as add_request's)."""
        spans = token_ids.spans if isinstance(token_ids, MultimodalPrompt) else ()
        raw = token_ids.ids if isinstance(token_ids, MultimodalPrompt) else token_ids
        ids = self._check_prompt(list(raw), SamplingParams(max_tokens=None), generates=False)
        keys = MultimodalPrompt(ids, spans).cache_key_ids() if spans else None
        choice = self.loras.choose(lora)
        seq = Sequence("__score__", ids, SamplingParams(max_tokens=1), images=spans,
                       prompt_keys=self.loras.keyed(choice, ids, keys), lora=choice)
        out = np.empty((len(ids), self.model_config.vocab_size), np.float32)
        for step in self.prefill.chunked([seq], self.config.max_num_batched_tokens, _every_row, "score"):
            out[step.starts[0] : step.starts[0] + len(step.rows)] = step.rows
        return out

    # -- embeddings ----------------------------------------------------------------------------
    def embed(self, prompts: list[list[int]]) -> np.ndarray:
        """Unit-norm embeddings float32 [n, d_model] of token-id prompts (engine/embedding.py);
        tokenize text with embed_ids first (any thread)."""
        return embed_prompts(self.prefill, prompts, self.model_config.pooling, self.config.max_num_batched_tokens)

    def embed_ids(self, prompt: str | list[int]) -> list[int]:
        """A text (tokenized with the model's special tokens) or token ids, checked for embedding."""
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt, add_special=True, parse_special=False)
        elif not isinstance(prompt, (list, tuple)):
            raise InvalidRequest(f"an input must be a string or a list of token ids, got {type(prompt).__name__}")
        return self._check_prompt(list(prompt), SamplingParams(max_tokens=None), generates=False)

    # -- metrics -----------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        bm = self.block_manager
        live = sum(s.num_computed_tokens for s in self.scheduler.running)
        slots = sum(len(s.block_table) for s in self.scheduler.running) * bm.block_size
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "preemptions": self.scheduler.num_preemptions,
            "kv_blocks_total": bm.num_blocks,
            "kv_cache_bytes": self.plan.kv_cache_bytes,
            "kv_bytes_per_token": self.plan.kv_bytes_per_token,
            "kv_blocks_used": bm.num_used_blocks,
            "kv_blocks_cached": bm.num_cached_free_blocks,
            "kv_utilization": live / slots if slots else 1.0,
            "state_slots_total": bm.num_state_slots,  # a hybrid model's recurrent states (0 otherwise)
            "state_slots_used": bm.num_state_slots - (len(bm.states.free) if bm.states else 0),
            "state_snapshots": len(bm.states.snapshot_of) if bm.states else 0,
            "state_cache_bytes": self.plan.state_cache_bytes,
            "prefix_cache_hit_rate": bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
            **{k: float(v) for k, v in self.stats.items()},
            **(self.spec.metrics() if self.spec is not None else {}),
            **({k: float(v) for k, v in self.disk.cache.stats.items()} if self.disk is not None else {}),
        }

    # -- named prefixes on disk (the server's /slots/{name}) --------------------------------------
    def prefix_slot(self, action: str, name: str, ids: list[int] | None = None) -> dict[str, int]:
        """save (ids' K/V computed and written to the disk prefix cache under `name`), restore
        (its blocks into the pool) or erase (the name) a conversation's prefix."""
        if self.disk is None:
            raise InvalidRequest("saving and restoring prefixes needs the disk prefix cache: start with "
                                 "--prefix-cache-dir DIR")
        if action == "save":
            ids = self._check_prompt(list(ids or []), SamplingParams(max_tokens=None), generates=False)
            return self.disk.save_named(name, ids, self.prefill, self.config.max_num_batched_tokens)
        return self.disk.restore_named(name) if action == "restore" else self.disk.erase_named(name)

    def close(self) -> None:
        """At shutdown: the disk prefix cache saves what is cached in memory and finishes writing."""
        if self.disk is not None:
            self.disk.close()
            self.disk = None


def _every_row(_seq_index: int, start: int, end: int) -> list[int]:
    """Scoring wants every token's logits."""
    return list(range(end - start))
