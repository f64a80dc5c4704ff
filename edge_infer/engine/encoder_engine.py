"""EncoderEngine: the engine of an encoder model (bert and its kin, models/encoder.py): embeddings and
rerank scores, no generation, no KV cache. The engine thread (worker.py) runs it as it runs an
LLMEngine: the request methods refuse generation by name, and `embed` / `score_pairs` run whole
inputs packed into steps of up to `capacity` tokens (a step never splits an input: attention
goes both ways over it).

Pooling follows the file's pooling_type as llama.cpp's build_pooling does: mean over the input,
its first token (cls), its last, or rank (the first token through the classification head: a
cross-encoder's relevance score). Embeddings are L2-normalised (as llama-cpp-python's embed)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from edge_infer import hub
from edge_infer.config import EngineConfig, RuntimePlan
from edge_infer.engine.device import encoder_backend
from edge_infer.engine.loader import check_fits
from edge_infer.engine.sequence import LogitsProcessor
from edge_infer.errors import InvalidRequest
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models.encoder import Encoder
from edge_infer.models.encoder_config import encoder_config_from_gguf, encoder_refusal
from edge_infer.models.encoder_weights import load_encoder_weights
from edge_infer.outputs import RequestOutput
from edge_infer.sampling_params import SamplingParams
from edge_infer.tokenizer import Tokenizer

log = logging.getLogger("edge_infer.engine")

EMBED_POOLINGS = ("mean", "cls", "last")


class EncoderEngine:
    """Same construction and thread rules as LLMEngine (one thread calls it)."""

    def __init__(self, config: EngineConfig, gguf: GGUFFile | None = None) -> None:
        t0 = time.perf_counter()
        self.config = config
        path = hub.resolve_model(config.model) if gguf is None else gguf.path
        check_fits(str(path), os.path.getsize(path), config)
        self.gguf = gguf or GGUFFile(path)
        self.model_config = cfg = encoder_config_from_gguf(self.gguf)
        backend = encoder_backend(config, cfg.arch)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        weights = load_encoder_weights(self.gguf, cfg, backend)
        if config.max_model_len and config.max_model_len > cfg.context_length:
            raise InvalidRequest(f"max_model_len {config.max_model_len} exceeds the model's context length "
                                 f"{cfg.context_length}")
        max_len = min(config.max_model_len or cfg.context_length, cfg.context_length)
        self.encoder = Encoder(cfg, weights, backend, max(config.max_num_batched_tokens, max_len))
        self.backend = backend
        self.plan = RuntimePlan(str(path), 0, config.block_size, 0, config.kv_cache_dtype, max_len,
                                backend.n_threads, backend.name)
        self.requests: dict[str, Any] = {}  # never any: the worker's loop reads it
        self.eos_ids: tuple[int, ...] = ()
        self.vision = None  # an encoder takes no images
        self.stats = {"inputs": 0, "tokens": 0, "steps": 0}
        self.started = time.monotonic()
        self._pooled([[0, 0]])  # warm-up: every kernel compiled or loaded from numba's cache
        log.info("loaded %s (%s encoder, pooling %s) in %.2fs, %d threads", path, cfg.arch, cfg.pooling,
                 time.perf_counter() - t0, backend.n_threads)

    # -- what an encoder refuses -----------------------------------------------------------------
    def _no_generation(self) -> InvalidRequest:
        return InvalidRequest(encoder_refusal(self.gguf) or f"{self.model_config.arch} does not generate text")

    def prepare_prompt(self, prompt: str | list[int], params: SamplingParams) -> tuple[str | None, list[int]]:
        raise self._no_generation()

    def compile_constraints(self, params: SamplingParams) -> list[LogitsProcessor] | None:
        raise self._no_generation()

    def prepare_images(self, runs: list[list[int]], refs: Any, **_: Any) -> Any:
        raise self._no_generation()

    def add_request(self, request_id: str, prompt: str | list[int] | None, params: SamplingParams | None = None,
                    **_: Any) -> None:
        raise self._no_generation()

    def score(self, token_ids: Any, lora: Any = ()) -> np.ndarray:
        raise self._no_generation()

    def load_adapter(self, name: str, path: str, scale: float = 1.0) -> Any:
        raise InvalidRequest(f"{self.model_config.arch} is an encoder: it takes no LoRA adapters")

    def unload_adapter(self, name: str) -> None:
        raise InvalidRequest(f"{self.model_config.arch} is an encoder: it takes no LoRA adapters")

    def prefix_slot(self, action: str, name: str, ids: list[int] | None = None) -> dict[str, int]:
        raise InvalidRequest(f"{self.model_config.arch} is an encoder: it keeps no KV cache to save or restore")

    def abort(self, request_id: str) -> bool:
        return False

    def has_unfinished_requests(self) -> bool:
        return False

    def step(self) -> list[RequestOutput]:
        return []

    # -- inputs ----------------------------------------------------------------------------------
    def embed_ids(self, prompt: str | list[int]) -> list[int]:
        """A text (tokenized with the model's special tokens: [CLS] ... [SEP]) or token ids,
        checked: non-empty, in the vocabulary, at most max_model_len tokens. Any thread."""
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt, add_special=True, parse_special=False)
        elif not isinstance(prompt, (list, tuple)):
            raise InvalidRequest(f"an input must be a string or a list of token ids, got {type(prompt).__name__}")
        return self._check(list(prompt))

    def rerank_ids(self, query: str, document: str) -> list[int]:
        """The pair a cross-encoder scores, as llama.cpp's server builds it (format_rerank): BOS
        if the vocabulary adds one, the query, EOS (or SEP when there is no EOS) if it adds EOS,
        SEP if it adds SEP, the document, EOS again: [CLS] query [SEP] document [SEP] for a
        converted BERT. Any thread."""
        tok = self.tokenizer
        q = tok.encode(query, add_special=False, parse_special=False)
        d = tok.encode(document, add_special=False, parse_special=False)
        eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
        bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        end = [eos] if tok.add_eos and eos is not None else []
        sep = [tok.sep_id] if tok.add_sep and tok.sep_id is not None else []
        return self._check(bos + q + end + sep + d + end)

    def _check(self, ids: list[int]) -> list[int]:
        if not ids:
            raise InvalidRequest("an input is empty (no tokens)")
        vocab = self.model_config.vocab_size
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
                raise InvalidRequest(f"token id {t!r} is outside the vocabulary (0..{vocab - 1})")
        if len(ids) > self.plan.max_model_len:
            raise InvalidRequest(f"an input of {len(ids)} tokens exceeds the model's maximum of "
                                 f"{self.plan.max_model_len} tokens")
        return [int(t) for t in ids]

    # -- computing -------------------------------------------------------------------------------
    @property
    def rerank_method(self) -> str:
        """"rank": the file's classification head scores each (query, document) pair;
        "cosine": the cosine of the query's and the document's embeddings."""
        return "rank" if self.model_config.pooling == "rank" else "cosine"

    def embed(self, prompts: list[list[int]]) -> np.ndarray:
        """Unit-norm embeddings float32 [n, d_model] of checked token-id inputs (embed_ids)."""
        pooling = self.model_config.pooling
        if pooling not in EMBED_POOLINGS:
            what = "a reranker: score pairs with rerank" if pooling == "rank" else "no one vector per input"
            raise InvalidRequest(f"this model's pooling_type is {pooling!r} ({what}); embeddings pool "
                                 f"{', '.join(EMBED_POOLINGS)}")
        rows = self.encoder.dense_out(self._pooled(prompts)).astype(np.float64)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return (rows / np.where(norms > 0, norms, 1.0)).astype(np.float32)

    def score_pairs(self, pairs: list[list[int]]) -> np.ndarray:
        """float32 [len(pairs)]: a rank model's relevance score of each checked pair (rerank_ids)."""
        if self.rerank_method != "rank":
            raise InvalidRequest(f"this model's pooling_type is {self.model_config.pooling!r}, not 'rank': it has no "
                                 "classification head to score pairs with (rerank by embedding cosine instead)")
        return np.ascontiguousarray(self.encoder.rank_head(self._pooled(pairs))[:, 0], np.float32)

    def _pooled(self, prompts: list[list[int]]) -> np.ndarray:
        """float32 [n, D]: each input's hidden states pooled (rank: as the head reads them, first token or mean)."""
        cfg = self.model_config
        # a rank head reads the first token, or the mean (modern-bert's classifier.pooling_type)
        pooling = cfg.cls_pooling if cfg.pooling == "rank" else cfg.pooling
        out = np.empty((len(prompts), cfg.d_model), np.float32)
        for idx, starts, hidden in self._steps(prompts):
            for i, s in zip(idx, starts, strict=True):
                n = len(prompts[i])
                if pooling == "mean":
                    out[i] = hidden[s : s + n].astype(np.float64).mean(axis=0)
                elif pooling == "last":
                    out[i] = hidden[s + n - 1]
                else:  # cls, none: the first token
                    out[i] = hidden[s]
        self.stats["inputs"] += len(prompts)
        return out

    def _steps(self, prompts: list[list[int]]) -> Iterator[tuple[list[int], list[int], np.ndarray]]:
        """(input indices, their first rows, hidden float32 [T, D]) per step of whole inputs."""
        cap = self.encoder.capacity
        i = 0
        while i < len(prompts):
            idx, starts, total = [], [], 0
            while i < len(prompts) and total + len(prompts[i]) <= cap:
                idx.append(i)
                starts.append(total)
                total += len(prompts[i])
                i += 1
            tokens = np.fromiter((t for j in idx for t in prompts[j]), np.int32, total)
            positions = np.concatenate([np.arange(len(prompts[j]), dtype=np.int32) for j in idx])
            seq_start = np.repeat(np.array(starts, np.int32), [len(prompts[j]) for j in idx])
            seq_end = seq_start + np.repeat(np.array([len(prompts[j]) for j in idx], np.int32),
                                            [len(prompts[j]) for j in idx])
            hidden = self.encoder.forward(tokens, positions, seq_start, seq_end)
            self.stats["steps"] += 1
            self.stats["tokens"] += total
            yield idx, starts, self.backend.to_host(hidden, False)

    def metrics(self) -> dict[str, float]:
        return {"running": 0, "waiting": 0, **{k: float(v) for k, v in self.stats.items()}}
