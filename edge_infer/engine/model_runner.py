"""Turns a scheduled batch into kernel arguments, runs the forward pass, returns logits.

Owns the KV pool (one [num_blocks, block_size, n_kv_heads, head_dim] pair per layer) and does
the copy-on-write block copies the block manager asks for before each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.engine.scheduler import SchedulerOutput
from edge_infer.engine.sequence import Sequence
from edge_infer.models.config import ModelConfig
from edge_infer.models.transformer import StepInputs, Transformer
from edge_infer.models.weights import ModelWeights

# f16 is stored as IEEE half bits; q8_0 as int8 with a float32 scale per (token, head)
KV_DTYPES = {"f16": np.uint16, "f32": np.float32, "q8_0": np.int8}


def kv_block_bytes(cfg: ModelConfig, block_size: int, kv_dtype: str) -> int:
    """Bytes of K and V for one block across all layers (scales included for q8_0)."""
    item = np.dtype(KV_DTYPES[kv_dtype]).itemsize
    per_head = cfg.head_dim * item + (4 if kv_dtype == "q8_0" else 0)
    return 2 * cfg.n_layers * block_size * cfg.n_kv_heads * per_head


def make_kv_pool(cfg: ModelConfig, num_blocks: int, block_size: int, kv_dtype: str) -> list[tuple[np.ndarray, ...]]:
    """Per layer (k_cache, k_scale, v_cache, v_scale); scales are empty unless q8_0."""
    dt = KV_DTYPES[kv_dtype]
    shape = (num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
    sshape = shape[:3] if kv_dtype == "q8_0" else (0, 0, 0)
    return [(np.zeros(shape, dt), np.zeros(sshape, np.float32), np.zeros(shape, dt), np.zeros(sshape, np.float32))
            for _ in range(cfg.n_layers)]


@dataclass(slots=True)
class StepResult:
    """logits[i] belongs to rows[i] = (sequence, index of the token within this step's chunk)."""

    logits: np.ndarray
    rows: list[tuple[Sequence, int]]


class ModelRunner:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, num_blocks: int, block_size: int,
                 kv_dtype: str, n_threads: int) -> None:
        self.cfg, self.block_size = cfg, block_size
        self.model = Transformer(cfg, weights, n_threads)
        self.kv = make_kv_pool(cfg, num_blocks, block_size, kv_dtype)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            for layer in self.kv:
                for a in layer:
                    if a.size:
                        a[dst] = a[src]

    def build_inputs(self, chunks: list[tuple[Sequence, list[int], list[int]]]) -> tuple[StepInputs, list[tuple[Sequence, int]]]:
        """chunks: (sequence, the token ids computed this step, indices within them that need
        logits). Tokens start at the sequence's num_computed_tokens."""
        bs = self.block_size
        n = sum(len(t) for _, t, _ in chunks)
        tokens = np.empty(n, np.int32)
        positions = np.empty(n, np.int32)
        slots = np.empty(n, np.int64)
        token_seq = np.empty(n, np.int32)
        width = max(len(s.block_table) for s, _, _ in chunks)
        tables = np.zeros((len(chunks), width), np.int32)
        rows: list[tuple[Sequence, int]] = []
        logit_rows: list[int] = []
        at = 0
        for si, (seq, toks, want) in enumerate(chunks):
            start = seq.num_computed_tokens
            m = len(toks)
            pos = np.arange(start, start + m, dtype=np.int64)
            bt = np.asarray(seq.block_table, dtype=np.int64)
            tokens[at : at + m] = toks
            positions[at : at + m] = pos
            slots[at : at + m] = bt[pos // bs] * bs + pos % bs
            token_seq[at : at + m] = si
            tables[si, : len(seq.block_table)] = seq.block_table
            for j in want:
                logit_rows.append(at + j)
                rows.append((seq, j))
            at += m
        inp = StepInputs(tokens, positions, slots, token_seq, tables, np.asarray(logit_rows, dtype=np.int64))
        return inp, rows

    def run(self, chunks: list[tuple[Sequence, list[int], list[int]]]) -> StepResult:
        inp, rows = self.build_inputs(chunks)
        logits = self.model.forward(inp, self.kv)
        return StepResult(logits, rows)

    def execute(self, sched: SchedulerOutput) -> StepResult:
        """Run one scheduled step; logits for every sequence that samples (its last row)."""
        self.copy_blocks(sched.copies)
        chunks = []
        for s in sched.scheduled:
            seq = s.seq
            start = seq.num_computed_tokens
            known = min(s.num_new_tokens, seq.num_tokens - start)
            toks = seq.tokens_slice(start, start + known) + seq.spec_token_ids[: s.num_new_tokens - known]
            if seq.spec_token_ids and s.samples:
                want = list(range(known - 1, s.num_new_tokens))  # verify every proposed token
            elif s.samples:
                want = [s.num_new_tokens - 1]
            else:
                want = []
            chunks.append((seq, toks, want))
        return self.run(chunks)
