"""Turns a scheduled batch into kernel arguments, runs the forward pass, returns logits.

Owns the KV pool (one [num_blocks, block_size, n_kv_heads, head_dim] pair per attention layer with
K/V of its own, made by the backend; gemma4's KV-shared layers read their source layer's) and, for a hybrid model, the state pool (per recurrent layer
[num_state_slots, *state shape]: one slot per sequence, as the block manager assigns them), and
has the backend do the block and state-slot copies the block manager asked for before each
step. The transformer owns the forward's preallocated workspace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_infer.engine.mrope import mrope_positions
from edge_infer.engine.scheduler import ScheduledChunk, SchedulerOutput
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import UnsupportedModelError
from edge_infer.models.backend import Backend
from edge_infer.models.config import ModelConfig
from edge_infer.models.lora_set import LoraChoice, LoraRows
from edge_infer.models.step_logits import StepLogits
from edge_infer.models.transformer import StepInputs, Transformer
from edge_infer.models.weights import ModelWeights

FLOAT_KV_DTYPES = ("f16", "f32")  # every other KV type is a GGML block type
KV_BLOCK_ELEMENTS = 32  # the elements of one block of each of them (q8_0 ... iq4_nl)

if TYPE_CHECKING:
    from edge_infer.engine.image_prompt import ImageSpan


def kv_block_bytes(backend: Backend, cfg: ModelConfig, block_size: int, kv_dtype: str,
                   kv_dtype_v: str | None = None) -> int:
    """Bytes of K (kv_dtype) and V (kv_dtype_v, default the same) for one block across the attention layers, in
    the backend's KV layout. A block type (q8_0, q4_0, ...) needs head sizes that are multiples
    of its 32-element blocks, as llama.cpp's does."""
    shapes = _kv_shapes(cfg)
    blocked = [t for t in (kv_dtype, kv_dtype_v or kv_dtype) if t not in FLOAT_KV_DTYPES]
    odd = sorted(dim for _, dim in shapes if dim % KV_BLOCK_ELEMENTS)
    if blocked and odd:
        raise UnsupportedModelError(f"KV cache type {blocked[0]} stores blocks of {KV_BLOCK_ELEMENTS} elements along the "
                                    f"head dimension, and this {cfg.arch} model's head size {odd[0]} is not a multiple "
                                    "of it: use f16 or f32")
    return sum(backend.kv_block_bytes(len(layers), heads, dim, block_size, kv_dtype, kv_dtype_v)
               for (heads, dim), layers in shapes.items())


def _kv_shapes(cfg: ModelConfig) -> dict[tuple[int, int], list[int]]:
    """The layers keeping K/V of their own by their (KV heads, head size): one shape in most
    models, two in gemma4's (its sliding-window layers' differ)."""
    out: dict[tuple[int, int], list[int]] = {}
    for i in cfg.kv_layers:
        out.setdefault((cfg.layer_kv_heads(i), cfg.layer_head_dim(i)), []).append(i)
    return out


class ModelRunner:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, backend: Backend, num_blocks: int, block_size: int,
                 kv_dtypes: tuple[str, str], max_step_tokens: int, max_model_len: int | None = None,
                 num_state_slots: int = 0) -> None:
        """kv_dtypes: K's and V's types; max_step_tokens: the workspace's first size (a larger step grows it); max_model_len:
        the longest sequence (it picks Phi-3's long or short rope factors); num_state_slots: a
        hybrid model's state slots (the block manager's)."""
        self.cfg, self.block_size, self.backend = cfg, block_size, backend
        self.model = Transformer(cfg, weights, backend, max_step_tokens, max_model_len)
        pools = {i: pool for (heads, dim), layers in _kv_shapes(cfg).items()
                 for i, pool in zip(layers, backend.make_kv_pool(len(layers), num_blocks, block_size, heads, dim,
                                                                 *kv_dtypes))}
        self.kv_pool = [pools[i] for i in cfg.kv_layers]
        self.before_forward: Any = None  # called first in run and execute (the disk cache saves evicted blocks)
        # an image span's embeddings float32 [length, d_model] (engine/image_encoder.py; None: no images)
        self.image_rows: Callable[[ImageSpan], np.ndarray] | None = None
        self.image_noncausal = False  # gemma3: an image's tokens attend to the whole image (mtmd's non-causal decode)
        self.mrope = False  # qwen2vl with a projector: every row rotates by its M-RoPE components (engine/mrope.py)
        self.states = backend.make_state_pool(cfg.state_shapes, num_state_slots) if cfg.recurrent else []
        # what each layer's forward reads and writes: its KV pair, its recurrent state pool, both
        # (falcon-h1: (KV, states)), or None (nemotron_h's FFN layers)
        state_of = iter(self.states)
        self.kv: list[Any] = []
        for i in range(cfg.n_layers):
            # a KV-shared layer (gemma4, gemma3n) attends over its source layer's K/V
            attn = pools[cfg.kv_source(i)] if cfg.has_attention(i) else None
            state = next(state_of) if cfg.is_recurrent(i) else None
            self.kv.append((attn, state) if attn is not None and state is not None else state if attn is None else attn)

    def build_inputs(self, chunks: list[ScheduledChunk]) -> StepInputs:
        """The kernels' token-level arguments for a step's chunks (each starts at its
        sequence's num_computed_tokens)."""
        bs = self.block_size
        n = sum(c.num_new_tokens for c in chunks)
        tokens = np.empty(n, np.int32)
        positions = np.empty(n, np.int32)
        slots = np.empty(n, np.int64)
        token_seq = np.empty(n, np.int32)
        width = max(len(c.seq.block_table) for c in chunks)
        tables = np.zeros((len(chunks), width), np.int32)
        seq_slots = np.fromiter((c.seq.state_slot for c in chunks), np.int32, len(chunks))
        snap_rows: list[int] = []
        snap_slots: list[int] = []
        logit_rows: list[int] = []
        images: list[tuple[int, np.ndarray]] = []
        masked: list[tuple[int, int, int]] = []  # (first row, end row, position attention masks them at)
        lora: list[tuple[int, int, LoraChoice]] = []  # (first row, rows, adapters) of sequences with adapters
        mrope = np.empty((n if self.mrope else 0, 3), np.int32)
        at = 0
        for si, c in enumerate(chunks):
            seq, toks = c.seq, c.token_ids
            start = seq.num_computed_tokens
            m = len(toks)
            pos = np.arange(start, start + m, dtype=np.int64)
            bt = np.asarray(seq.block_table, dtype=np.int64)
            tokens[at : at + m] = toks
            positions[at : at + m] = pos
            if self.mrope:
                mrope[at : at + m] = mrope_positions(seq.images, start, m) if seq.images else pos[:, None]
            slots[at : at + m] = bt[pos // bs] * bs + pos % bs
            token_seq[at : at + m] = si
            tables[si, : len(seq.block_table)] = seq.block_table
            logit_rows.extend(at + j for j in c.logit_indices)
            for j, slot in c.snapshots:
                snap_rows.append(at + j)
                snap_slots.append(slot)
            if seq.lora and self.model.lora is not None:  # a draft model runs without its target's adapters
                lora.append((at, m, seq.lora))
            if seq.images:
                images += self._image_inputs(seq, start, min(m, seq.num_tokens - start), at)
                if self.image_noncausal:
                    for span in seq.images:  # each image token masked as the image's last one
                        lo, hi = max(start, span.start), min(start + m, span.start + span.length)
                        if lo < hi:
                            # never past this chunk's last token: a cut image (longer than the budget)
                            # sees what is computed so far, never a slot not yet written
                            last = min(span.start + span.length, start + m) - 1
                            masked.append((at + lo - start, at + hi - start, last))
            at += m
        mask_pos = np.empty(0, np.int32)
        if masked:
            mask_pos = positions.copy()
            for r0, r1, p in masked:
                mask_pos[r0:r1] = p
        return StepInputs(tokens, positions, slots, token_seq, tables, np.asarray(logit_rows, dtype=np.int64), seq_slots,
                          np.asarray(snap_rows, np.int32), np.asarray(snap_slots, np.int32), tuple(images),
                          mask_pos, LoraRows.build(n, lora) if lora else None, mrope)

    def _image_inputs(self, seq: Sequence, start: int, m: int, at: int) -> list[tuple[int, np.ndarray]]:
        """(step row, embedding rows) of the image positions among seq's tokens start .. start + m - 1
        (the chunk's first row is `at`)."""
        out = []
        for span in seq.images:
            lo, hi = max(start, span.start), min(start + m, span.start + span.length)
            if lo < hi:
                if self.image_rows is None:
                    raise RuntimeError("a prompt with images on an engine without a projector")
                rows = self.image_rows(span)
                out.append((at + lo - start, rows[lo - span.start : hi - span.start]))
        return out

    def run(self, chunks: list[ScheduledChunk], hidden: bool = False) -> np.ndarray:
        """Forward the chunks; logits float32 [M, vocab], one row per logit index, chunk after
        chunk (hidden: the final normed hidden states [M, d_model] instead)."""
        return self.model.forward(self.build_inputs(chunks), self.kv, hidden)

    def execute(self, sched: SchedulerOutput, whole: np.ndarray) -> StepLogits:
        """Run one scheduled step (block and state copies first); its logits for the sampler,
        whole on the host where whole [M] bool is set (see Transformer.forward_sampled)."""
        if self.before_forward is not None:  # before the block copies: they may overwrite an evicted block
            self.before_forward()
        self.backend.copy_blocks(self.kv_pool, sched.copies)
        if sched.state_copies:
            self.backend.copy_states(self.states, sched.state_copies)
        return self.model.forward_sampled(self.build_inputs(sched.chunks), self.kv, whole)

    def read_block(self, block: int) -> list[np.ndarray]:
        """Copies of one block's K and V in every attention layer (the pool's own layout; CPU)."""
        return [np.array(layer[j][block]) for layer in self.kv_pool for j in (0, 2)]

    def write_block(self, block: int, arrays: list[np.ndarray]) -> None:
        """Put read_block's arrays (of a pool of the same layout) into one block."""
        it = iter(arrays)
        for layer in self.kv_pool:
            for j in (0, 2):
                layer[j][block] = next(it)

    def read_state(self, slot: int) -> list[np.ndarray]:
        """Copies of one state slot's arrays in every recurrent layer (a hybrid model's; CPU)."""
        return [np.array(a[slot]) for layer in self.states for a in layer]

    def write_state(self, slot: int, arrays: list[np.ndarray]) -> None:
        """Put read_state's arrays into one state slot."""
        it = iter(arrays)
        for layer in self.states:
            for a in layer:
                a[slot] = next(it)

    def shift_kv(self, moves: np.ndarray) -> None:
        """A context shift's row moves (int64 [m, 3]: src slot, dst slot, position delta) in every
        attention layer with K/V of its own; keys re-rotated by each layer's RoPE."""
        cfg = self.cfg
        for li, layer in zip(cfg.kv_layers, self.kv_pool):
            self.backend.shift_kv(layer, moves, cfg.layer_head_dim(li), cfg.layer_n_rot(li), self.model.rope[li][0],
                                  cfg.rope_neox)
