"""Embeddings: prompts run through the model to their final normed hidden states (llama.cpp's
result_norm), pooled as the file's `pooling_type` says (mean, the first token, or the last:
decoder models without the key pool the last token), L2-normalised.

Prompts are packed into steps of up to max_num_batched_tokens tokens (a long prompt over
several steps, short ones several to a step, by engine/prefill.py); each holds KV blocks only
while it runs, so embedding shares the pool with generation (a full pool is OutOfMemoryBudget,
not a wait).
"""

from __future__ import annotations

import numpy as np

from edge_infer.engine.prefill import Prefill
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import InvalidRequest
from edge_infer.sampling_params import SamplingParams

POOLABLE = ("mean", "cls", "last")


def embed(prefill: Prefill, prompts: list[list[int]], pooling: str, budget: int) -> np.ndarray:
    """float32 [len(prompts), d_model], unit rows; prompts already checked token ids."""
    if pooling not in POOLABLE:
        raise InvalidRequest(f"this model's pooling_type is {pooling!r}: it gives no one vector per input "
                             f"(embeddings pool {', '.join(POOLABLE)})")
    sums = np.zeros((len(prompts), prefill.runner.cfg.d_model), np.float64)
    seqs = [Sequence(f"__embed_{i}__", ids, SamplingParams(max_tokens=1)) for i, ids in enumerate(prompts)]

    def rows_of(i: int, start: int, end: int) -> list[int]:
        return _rows(pooling, start, end, len(prompts[i]))

    for step in prefill.chunked(seqs, budget, rows_of, "embed", hidden=True):
        owners = [i for c, i in zip(step.chunks, step.owners) for _ in c.logit_indices]
        for row, i in zip(step.rows, owners):
            sums[i] += row
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


def cosine_scores(embeddings: np.ndarray) -> np.ndarray:
    """float32 [n - 1]: the cosine of row 0 (a query's unit-norm embedding) with each other row
    (the documents'): how a model without a rerank head ranks documents."""
    rows = embeddings.astype(np.float64)
    return (rows[1:] @ rows[0]).astype(np.float32)
