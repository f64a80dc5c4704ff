"""Start-up: open the model, size the KV pool from the memory budget, build the engine parts and
warm the JIT so the first request does not pay for compilation."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from edge_infer import hub
from edge_infer.config import EngineConfig, RuntimePlan, SpecConfig
from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.device import make_backend
from edge_infer.engine.model_runner import ModelRunner, kv_block_bytes
from edge_infer.engine.prefill import Prefill
from edge_infer.engine.scheduler import ScheduledChunk, Scheduler
from edge_infer.engine.sequence import Sequence
from edge_infer.engine.state_slots import StateSlots
from edge_infer.errors import InvalidRequest, OutOfMemoryBudget
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import config_from_gguf
from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.weights import decode_weight_bytes, load_weights
from edge_infer.sampling_params import SamplingParams
from edge_infer.tokenizer import Tokenizer

log = logging.getLogger("edge_infer.engine")

DEFAULT_KV_SHARE = 0.25  # of the memory available after loading the weights
DEFAULT_KV_CAP = 4 * 2**30


@dataclass(slots=True)
class LoadedModel:
    gguf: GGUFFile
    model_config: ModelConfig
    tokenizer: Tokenizer
    plan: RuntimePlan
    runner: ModelRunner
    block_manager: BlockManager
    scheduler: Scheduler
    prefill: Prefill  # sequences outside the scheduler (scoring, embeddings, a draft's shadows)


# state slots of a hybrid model beyond max_num_seqs: the sequences outside the scheduler
# (scoring, embeddings, warm-up) and forked samples, which take a slot each
SPARE_STATE_SLOTS = 4
LOAD_OVERHEAD = 256 * 2**20  # compiled kernels, workspace, tokenizer: beyond the file and the pool


def kv_budget(config: EngineConfig, per_token: int = 0, context: int = 0, backend: Backend | None = None) -> int:
    """The KV pool's bytes: kv_cache_memory when given, else a quarter of the host memory
    available now (after the weights), at most 4 GiB (on a GPU: the backend's share of the free
    device memory), and at most what max_num_seqs sequences of the longest allowed length can
    fill (per_token bytes each; a small model on a small machine is not handed a pool it cannot
    use)."""
    if config.kv_cache_memory is not None:
        return int(config.kv_cache_memory)
    if backend is None or backend.name == "cpu":
        import psutil

        budget = min(DEFAULT_KV_CAP, psutil.virtual_memory().available * DEFAULT_KV_SHARE)
    else:
        budget = backend.memory_available()
    if per_token and context:
        budget = min(budget, per_token * min(config.max_model_len or context, context) * config.max_num_seqs)
    return int(budget)


def state_pool_slots(config: EngineConfig, cfg: ModelConfig, budget: int) -> tuple[int, int, int]:
    """A hybrid model's state pool out of the KV budget: (sequence slots, prefix-cache
    snapshots, verification slots). Sequences: max_num_seqs + SPARE_STATE_SLOTS, with k_max
    verification slots each under speculation, fewer when they would take more than half the
    budget (admission then waits for a free slot: the log says how many fit). Snapshots:
    state_snapshots, by default 4 per max_num_seqs within a quarter of the budget. The KV pool
    keeps the rest. (0, 0, 0) for a model without recurrent layers."""
    if not cfg.recurrent:
        return 0, 0, 0
    per = cfg.state_bytes
    k = config.speculative.k_max if isinstance(config.speculative, SpecConfig) else 0
    seqs = min(config.max_num_seqs + SPARE_STATE_SLOTS, budget // 2 // (per * (1 + k)))
    if seqs <= SPARE_STATE_SLOTS:
        raise OutOfMemoryBudget(
            f"{cfg.arch}: a sequence's recurrent state takes {per} bytes" + (f" ({1 + k}x with speculation)" if k else "")
            + f"; {SPARE_STATE_SLOTS + 1} of them need more than half of kv_cache_memory ({budget} bytes): "
            "raise kv_cache_memory"
        )
    if seqs < config.max_num_seqs + SPARE_STATE_SLOTS:
        log.info("%s: %d recurrent-state slots fit the KV budget: at most %d sequences at once", cfg.arch, seqs,
                 seqs - SPARE_STATE_SLOTS)
    snaps = 0
    if config.enable_prefix_caching:
        snaps = min(4 * config.max_num_seqs, budget // 4 // per) if config.state_snapshots is None else config.state_snapshots
    return seqs, snaps, seqs * k


def check_fits(path: str, file_bytes: int, config: EngineConfig) -> None:
    """Refuse, before anything is loaded, a model whose weights (about the file's size: they are
    repacked at it or mapped as they are) plus an explicit KV pool cannot fit in the memory
    available, naming both sizes."""
    import psutil

    available = psutil.virtual_memory().available
    kv = int(config.kv_cache_memory or 0)
    need = file_bytes + kv + LOAD_OVERHEAD
    if need > available:
        raise OutOfMemoryBudget(
            f"{path}: the model needs about {need / 2**30:.2f} GiB ({file_bytes / 2**30:.2f} GiB of weights"
            + (f", {kv / 2**30:.2f} GiB of KV cache" if kv else "")
            + f", {LOAD_OVERHEAD / 2**20:.0f} MiB of runtime) but only {available / 2**30:.2f} GiB is available"
        )


def load_model(config: EngineConfig) -> LoadedModel:
    t0 = time.perf_counter()
    path = hub.resolve_model(config.model)
    check_fits(str(path), os.path.getsize(path), config)
    f = GGUFFile(path)
    cfg = config_from_gguf(f)
    backend = make_backend(config, cfg)
    n_threads = backend.n_threads
    weights = load_weights(f, cfg, backend)
    tokenizer = Tokenizer.from_gguf(f)

    kv_v = config.kv_cache_dtype_v or config.kv_cache_dtype
    per_block = kv_block_bytes(backend, cfg, config.block_size, config.kv_cache_dtype, kv_v)
    budget = kv_budget(config, per_block // config.block_size, cfg.context_length, backend)
    num_slots, num_snaps, num_spec = state_pool_slots(config, cfg, budget)
    state_bytes = (num_slots + num_snaps + num_spec) * cfg.state_bytes
    num_blocks = (budget - state_bytes) // per_block
    if num_blocks < 2:
        taken = (f" after {state_bytes} bytes of recurrent state ({num_slots + num_snaps + num_spec} slots: lower "
                 "max_num_seqs or state_snapshots)") if state_bytes else ""
        raise OutOfMemoryBudget(
            f"kv_cache_memory of {budget} bytes holds fewer than 2 KV blocks ({per_block} bytes each){taken} "
            f"for {cfg.arch}"
        )
    capacity = num_blocks * config.block_size
    max_len = min(config.max_model_len or cfg.context_length, cfg.context_length)
    if config.max_model_len and config.max_model_len > cfg.context_length:
        raise InvalidRequest(f"max_model_len {config.max_model_len} exceeds the model's context length {cfg.context_length}")
    if max_len > capacity:
        if config.max_model_len:
            raise OutOfMemoryBudget(
                f"max_model_len {max_len} needs {max_len * per_block // config.block_size} bytes of KV cache; "
                f"the budget of {budget} bytes holds {capacity} tokens"
            )
        log.info("max_model_len capped from %d to %d tokens by the KV budget", max_len, capacity)
        max_len = capacity
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
        raise InvalidRequest("without chunked prefill, max_num_batched_tokens must be at least max_model_len")
    plan = RuntimePlan(str(path), num_blocks, config.block_size, num_blocks * per_block, config.kv_cache_dtype,
                       max_len, n_threads, backend.name, decode_weight_bytes(weights), num_slots, num_snaps, state_bytes,
                       kv_v)
    states = StateSlots(num_slots, num_snaps, config.state_snapshot_interval, num_spec) if num_slots else None
    runner = ModelRunner(cfg, weights, backend, num_blocks, config.block_size, (config.kv_cache_dtype, kv_v),
                         config.max_num_batched_tokens, max_len, states.total if states else 0)
    bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching, states)
    sched = Scheduler(bm, config.max_num_seqs, config.max_num_batched_tokens, config.enable_chunked_prefill,
                      config.prefill_chunk_while_decoding)
    prefill = Prefill(runner, bm)
    _warm_up(prefill)
    pool = f", {num_slots} + {num_snaps} state slots ({state_bytes / 2**20:.1f} MiB)" if num_slots else ""
    log.info("loaded %s (%s) in %.2fs: %d KV blocks of %d tokens (%.0f MiB %s)%s, %d threads", path.name, cfg.arch,
             time.perf_counter() - t0, num_blocks, config.block_size, plan.kv_cache_bytes / 2**20,
             plan.kv_types, pool, n_threads)
    return LoadedModel(f, cfg, tokenizer, plan, runner, bm, sched, prefill)


def _warm_up(prefill: Prefill) -> None:
    """One tiny forward (2 tokens, then 1) so every kernel is compiled or loaded from cache."""
    seq = Sequence("__warmup__", [0, 0, 0], SamplingParams(max_tokens=1))
    try:
        for n in (2, 1):
            prefill.reserve(seq, n)
            start = seq.num_computed_tokens
            prefill.forward([ScheduledChunk(seq, seq.tokens_slice(start, start + n), [n - 1])])
    finally:
        prefill.release(seq)
        prefill.bm.reset_prefix_cache()
