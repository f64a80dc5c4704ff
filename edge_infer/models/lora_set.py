"""The LoRA adapters loaded over one model and how a step applies them: every adapter's update of
a base matrix stacked into one pair of arrays (kernels_cpu/lora.py's layout), each token row's
adapters as a CSR table, and the backend seen by the forward with the updates added after each
matmul (llama.cpp's build_lora_mm). Adapters keep their slot while loaded, so a slot names one
adapter for as long as a sequence may use it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from edge_infer.errors import InvalidRequest, UnsupportedModelError
from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.backend import Backend, LoraBackend
from edge_infer.models.lora import EMBEDDING, LoraAdapter, check_against
from edge_infer.models.weights import ModelWeights

# a sequence's adapters: (slot, scale) pairs (a row adds its updates in slot order)
LoraChoice = tuple[tuple[int, float], ...]
PARALLEL_WORK = 1 << 18  # multiply-adds of one matrix's updates below which they run on the calling thread


@dataclass(frozen=True, slots=True)
class MatrixLora:
    """Every loaded adapter's update of one base matrix [R, K]: a [sum of ranks, K] (the A's
    stacked), bt [sum of ranks, R] (the B's transposed), float32, or uint16 half bits when every
    adapter's pair was F16; per slot its first row off, its rank (0: the adapter leaves this
    matrix alone) and alpha, int32 / float32 [slots]."""

    a: np.ndarray
    bt: np.ndarray
    off: np.ndarray
    rank: np.ndarray
    alpha: np.ndarray
    work: int = 0  # multiply-adds of one row's update at the largest rank (set by make)

    @staticmethod
    def make(a: np.ndarray, bt: np.ndarray, off: np.ndarray, rank: np.ndarray, alpha: np.ndarray) -> MatrixLora:
        return MatrixLora(a, bt, off, rank, alpha, int(rank.max()) * (a.shape[1] + bt.shape[1]))


@dataclass(frozen=True, slots=True)
class LoraRows:
    """Each token row's adapters: row t's are entries row_ptr[t] .. row_ptr[t + 1] - 1 of adapter
    (int32 slots, ascending) and scale (float32, the request's adapter scale). row_ptr: int32
    [N + 1]."""

    row_ptr: np.ndarray
    adapter: np.ndarray
    scale: np.ndarray

    @staticmethod
    def build(n_rows: int, runs: Sequence[tuple[int, int, LoraChoice]]) -> LoraRows:
        """From (first row, row count, adapters) runs; rows in no run use none."""
        counts = np.zeros(n_rows, np.int32)
        for at, m, choice in runs:
            counts[at : at + m] = len(choice)
        row_ptr = np.zeros(n_rows + 1, np.int32)
        np.cumsum(counts, out=row_ptr[1:])
        adapter = np.empty(int(row_ptr[-1]), np.int32)
        scale = np.empty(int(row_ptr[-1]), np.float32)
        for at, m, choice in runs:
            k, base = len(choice), int(row_ptr[at])
            for j, (slot, s) in enumerate(sorted(choice)):  # slot order: each row adds its updates the same way
                adapter[base + j : base + m * k : k] = slot
                scale[base + j : base + m * k : k] = s
        return LoraRows(row_ptr, adapter, scale)

    def select(self, rows: np.ndarray) -> LoraRows:
        """The table of rows[0], rows[1], ... (the rows whose logits are wanted)."""
        counts = (self.row_ptr[1:] - self.row_ptr[:-1])[rows]
        row_ptr = np.zeros(rows.shape[0] + 1, np.int32)
        np.cumsum(counts, out=row_ptr[1:])
        idx = np.concatenate([np.arange(self.row_ptr[r], self.row_ptr[r + 1]) for r in rows]) if rows.shape[0] else \
            np.empty(0, np.int64)
        return LoraRows(row_ptr, self.adapter[idx], self.scale[idx])


# layer matrices computed by helpers that hold the plain backend (models/per_layer_input.py,
# models/altup.py): no LoRA update reaches them
_OUTSIDE = ("ple_in_proj", "ple_gate", "ple_proj", "alt_router", "laurel_l", "laurel_r")


def base_matrices(weights: ModelWeights) -> tuple[dict[str, list[QMatrix]], set[str]]:
    """The model's matrices that go through the forward's matmuls, by tensor name (a fused
    matrix edge-infer splits appears once per part), and the names of those computed elsewhere
    (gemma4's per-layer inputs, gemma3n's AltUp and LAuReL)."""
    out: dict[str, list[QMatrix]] = {}
    outside = {m.name for m in (*weights.alt_proj, *weights.alt_unembed)}
    for lw in weights.layers:
        for field, m in lw.matrices():
            if field in _OUTSIDE:
                outside.add(m.name)
            else:
                out.setdefault(m.name, []).append(m)
    out.setdefault(weights.output.name, []).append(weights.output)
    return out, outside


class LoraSet:
    """The adapters loaded over one model (CPU backend only), by slot; `tables` maps a base
    matrix's name to its MatrixLora, rebuilt when an adapter is loaded or unloaded."""

    def __init__(self, architecture: str, weights: ModelWeights, backend: Backend) -> None:
        if not callable(getattr(backend, "lora_add", None)):
            raise UnsupportedModelError(f"LoRA adapters run on the CPU backend only, not on {backend.name}")
        self.architecture = architecture
        self.matrices, self.outside = base_matrices(weights)
        # the token embedding, unless the output matrix is it (tied): then adapters may not touch it
        self.embedding = None if weights.output.name == weights.token_embd.name else weights.token_embd
        self.slots: list[LoraAdapter | None] = []
        self.tables: dict[str, MatrixLora] = {}
        # per slot with a token_embd pair: (A float32 [vocab, rank], the matrix's MatrixLora: an
        # identity as A (the kernel's A x is then x, A's row) and B transposed)
        self.embedding_tables: dict[int, tuple[np.ndarray, MatrixLora]] = {}
        self.backend = LoraMatmuls(backend, self)  # what a step with adapters runs its layers on

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.slots if a is not None]

    def adapter(self, name: str) -> LoraAdapter:
        return self.slots[self.slot_of(name)]  # type: ignore[return-value]

    def slot_of(self, name: str) -> int:
        for i, a in enumerate(self.slots):
            if a is not None and a.name == name:
                return i
        known = ", ".join(repr(n) for n in self.names) or "none are loaded"
        raise InvalidRequest(f"no LoRA adapter named {name!r} (loaded: {known})")

    def add(self, adapter: LoraAdapter) -> int:
        """Bind a read adapter (checked against the base) to a free slot; returns the slot."""
        if adapter.name in self.names:
            raise InvalidRequest(f"a LoRA adapter named {adapter.name!r} is loaded already (unload it first)")
        check_against(adapter, self.architecture, self.matrices, self.outside, self.embedding)
        slot = self.slots.index(None) if None in self.slots else len(self.slots)
        if slot == len(self.slots):
            self.slots.append(adapter)
        else:
            self.slots[slot] = adapter
        self._rebuild()
        return slot

    def remove(self, name: str) -> int:
        slot = self.slot_of(name)
        self.slots[slot] = None
        self._rebuild()
        return slot

    def _rebuild(self) -> None:
        n = len(self.slots)
        names = {t for a in self.slots if a is not None for t in a.pairs} - {EMBEDDING}
        tables = {}
        for t in names:
            m = self.matrices[t][0]
            off, rank, alpha = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.float32)
            a_parts, b_parts, halves, at = [], [], [], 0
            for i, ad in enumerate(self.slots):
                pair = None if ad is None else ad.pairs.get(t)
                if ad is None or pair is None:
                    continue
                off[i], rank[i], alpha[i] = at, pair.rank, ad.alpha
                a_parts.append(pair.a)
                b_parts.append(pair.b.T)
                halves.append(pair.half)
                at += pair.rank
            a_all, bt_all = np.concatenate(a_parts), np.concatenate(b_parts)
            if all(halves):  # F16 in every file: half bits, half the bytes each step reads
                a_all, bt_all = a_all.astype(np.float16).view(np.uint16), bt_all.astype(np.float16).view(np.uint16)
            tables[t] = MatrixLora.make(np.ascontiguousarray(a_all), np.ascontiguousarray(bt_all), off, rank, alpha)
            assert tables[t].a.shape[1] == m.cols and tables[t].bt.shape[1] == m.rows
        self.tables = tables
        self.embedding_tables = {}
        for i, ad in enumerate(self.slots):
            pair = None if ad is None else ad.pairs.get(EMBEDDING)
            if ad is None or pair is None:
                continue
            tab = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.float32)
            tab[1][i], tab[2][i] = pair.rank, ad.alpha
            self.embedding_tables[i] = (pair.a, MatrixLora.make(np.eye(pair.rank, dtype=np.float32),
                                                                np.ascontiguousarray(pair.b.T), *tab))

    def add_embedding(self, tokens: np.ndarray, rows: LoraRows, embed_scale: np.float32, h: np.ndarray) -> None:
        """h [N, d] (the tokens' embeddings, times embed_scale) += embed_scale * scale * B A[token]
        for the rows whose adapters have a token_embd pair (llama.cpp adds it before the scale),
        one adapter after another in slot order."""
        for slot, (a_rows, t) in sorted(self.embedding_tables.items()):
            keep = rows.adapter == slot
            if not keep.any():
                continue
            n = h.shape[0]
            entry_row = np.repeat(np.arange(n), np.diff(rows.row_ptr))
            row_ptr = np.zeros(n + 1, np.int32)
            np.cumsum(np.bincount(entry_row[keep], minlength=n), out=row_ptr[1:])
            x = np.ascontiguousarray(a_rows[tokens], np.float32)  # A's rows: the kernel's A x with A = I
            scale = (rows.scale[keep] * embed_scale).astype(np.float32)
            parallel = int(keep.sum()) * t.work >= PARALLEL_WORK
            self.backend._lora.lora_add(x, row_ptr, rows.adapter[keep], scale, t.off, t.rank, t.alpha, t.a, t.bt, h,
                                        parallel=parallel)


class LoraMatmuls:
    """The backend as a step's forward sees it when rows use adapters: each matmul followed by the
    LoRA updates of its matrices. One per model, given each such step's rows by `for_step`; every
    other method is the backend's own (bound here once: no lookup per call). A matmul of the
    step's n rows reads `rows`; one of fewer (the last layer, only the rows whose logits are
    wanted) reads `rows.select(selected)`."""

    def __init__(self, backend: Backend, lora: LoraSet) -> None:
        for name in dir(backend):
            if not name.startswith("_") and name != "matmuls":
                setattr(self, name, getattr(backend, name))
        self._b, self._set = backend, lora
        self._lora = cast(LoraBackend, backend)  # LoraSet took only a backend with lora_add
        self._rows: LoraRows | None = None
        self._selected_rows: LoraRows | None = None
        self._n, self._selected_ids = 0, np.empty(0, np.int64)

    def for_step(self, rows: LoraRows, n_rows: int, selected: np.ndarray) -> LoraMatmuls:
        self._rows, self._n, self._selected_ids = rows, n_rows, selected
        self._selected_rows = None if selected.shape[0] < n_rows else rows
        return self

    def matmuls(self, x: Any, ws: Sequence[QMatrix], outs: Sequence[Any], work: Any) -> None:
        self._b.matmuls(x, ws, outs, work)
        tables = self._set.tables
        for w, o in zip(ws, outs):
            t = tables.get(w.name)
            if t is None:
                continue
            rows = self._rows if x.shape[0] == self._n else self._selected()
            assert rows is not None
            # threads pay off once the updates read more than a few small matrices' worth (a
            # decode row's stay on the calling thread: a launch costs more than they do)
            self._lora.lora_add(x, rows.row_ptr, rows.adapter, rows.scale, t.off, t.rank, t.alpha, t.a, t.bt, o,
                                parallel=rows.adapter.shape[0] * t.work >= PARALLEL_WORK)

    def _selected(self) -> LoraRows:
        if self._selected_rows is None:
            assert self._rows is not None
            self._selected_rows = self._rows.select(self._selected_ids)
        return self._selected_rows
