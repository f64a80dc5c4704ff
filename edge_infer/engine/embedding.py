"""Embeddings: prompts run through the model to their final normed hidden states (llama.cpp's
result_norm), pooled as the file's `pooling_type` says (mean, the first token, or the last:
decoder models without the key pool the last token), L2-normalised.

Prompts are packed into steps of up to max_num_batched_tokens tokens (a long prompt over
several steps, short ones several to a step); each holds KV blocks only while it runs, so
embedding shares the pool with generation (a full pool is OutOfMemoryBudget, not a wait).
"""

from __future__ import annotations

import numpy as np

from edge_infer.engine.block_manager import BlockManager
from edge_infer.engine.model_runner import ModelRunner
from edge_infer.engine.scheduler import ScheduledChunk
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import InvalidRequest, OutOfMemoryBudget
from edge_infer.sampling_params import SamplingParams

POOLABLE = ("mean", "cls", "last")


def embed(runner: ModelRunner, bm: BlockManager, prompts: list[list[int]], pooling: str, budget: int) -> np.ndarray:
    """float32 [len(prompts), d_model], unit rows; prompts already checked token ids."""
    if pooling not in POOLABLE:
        raise InvalidRequest(f"this model's pooling_type is {pooling!r}: it gives no one vector per input "
                             f"(embeddings pool {', '.join(POOLABLE)})")
    width = runner.cfg.d_model
    sums = np.zeros((len(prompts), width), np.float64)
    seqs = [Sequence(f"__embed_{i}__", ids, SamplingParams(max_tokens=1)) for i, ids in enumerate(prompts)]
    pending = list(range(len(prompts)))
    try:
        while pending:
            chunks, owners, used = [], [], 0
            for i in pending:
                seq, ids = seqs[i], prompts[i]
                start = seq.num_computed_tokens
                take = min(len(ids) - start, budget - used)
                if take <= 0:
                    break
                if not bm.append_slots(seq, take):
                    if not chunks:
                        raise OutOfMemoryBudget("the KV pool is full with running requests; embed again later")
                    break
                end = start + take
                rows = _rows(pooling, start, end, len(ids))
                chunks.append(ScheduledChunk(seq, ids[start:end], rows))
                owners += [i] * len(rows)
                used += take
            hidden = runner.run(chunks, hidden=True)
            for row, i in zip(hidden, owners):
                sums[i] += row
            for c in chunks:
                c.seq.num_computed_tokens += len(c.token_ids)
            done = [i for i in pending if seqs[i].num_computed_tokens == len(prompts[i])]
            for i in done:
                bm.free(seqs[i])
            pending = [i for i in pending if i not in done]
    finally:
        for s in seqs:
            if s.block_table:
                bm.free(s)
    if pooling == "mean":
        sums /= np.array([len(p) for p in prompts], np.float64)[:, None]
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def _rows(pooling: str, start: int, end: int, n: int) -> list[int]:
    """The chunk's rows (offsets from start) that pooling reads."""
    if pooling == "mean":
        return list(range(end - start))
    if pooling == "cls":
        return [0] if start == 0 else []
    return [end - 1 - start] if end == n else []
