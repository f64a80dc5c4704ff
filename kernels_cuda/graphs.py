"""A step's inputs in one device buffer, and CUDA-graph replay of decode and verification steps.

`PackedInputs`: the six token-level arrays of a step (tokens, positions, slot_mapping,
token_seq, block_tables, logits_rows) as int32 views of one host buffer and one device buffer,
so a step's inputs cross to the device in one copy.

`StepGraph`: one recorded forward for a padded shape (BUCKETS tokens, a power-of-two count of
attention partitions). A step whose every token wants its logits (decode, speculative
verification) is padded to the next bucket (padding tokens: position 0, no KV write, their own
zero block-table row), its inputs copied into the graph's persistent buffers, and the graph
replayed. Every kernel argument of a recorded forward is a persistent buffer or a constant, so
a replay computes the same as an eager run on the same inputs: attention launches all the
bucket's partitions and those past a token's position contribute nothing (attention.py).

Recording runs the forward once with every launch appended to a list instead of run; on a
device the list is then captured into a CUDA graph (cuda.core's GraphBuilder, through which
numba-cuda >= 0.29 launches), in the simulator (no graphs) replay runs the list in order. Either
way the recorded arguments are all a replay has, so the simulator tests what the graph needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import cuda

from .attention import PART
from .intrinsics import SIMULATOR

log = logging.getLogger("edge_infer.engine")
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # tokens of a replayed step
Launch = tuple[Any, Any, Any, tuple[Any, ...]]  # (kernel, grid, block, arguments)


def bucket(n_tokens: int) -> int | None:
    """The padded token count of a replayable step of n_tokens, or None above the largest."""
    for b in BUCKETS:
        if b >= n_tokens:
            return b
    return None


def parts_bucket(max_pos: int) -> int:
    """Attention partitions a graph launches for positions up to max_pos: a power of two."""
    parts = max_pos // PART + 1
    return 1 << (parts - 1).bit_length()


class PackedInputs:
    """int32 host and device buffers holding [tokens N | positions N | slot_mapping N |
    token_seq N | logits_rows M | block_tables S x W]; `device` is a StepInputs-shaped tuple of
    device views (made once)."""

    def __init__(self, n: int, m: int, s: int, w: int, pinned: bool) -> None:
        self.n, self.m, self.s, self.w = n, m, s, w
        size = 4 * n + m + s * w
        self.host = cuda.pinned_array(size, np.int32) if pinned else np.empty(size, np.int32)
        self.dev = cuda.device_array(size, np.int32)
        self.views = self._split(self.host)
        self.device = self._split(self.dev)

    def _split(self, a: Any) -> tuple[Any, ...]:
        n, m = self.n, self.m
        t, p, sl, ts = (a[i * n : (i + 1) * n] for i in range(4))
        rows = a[4 * n : 4 * n + m]
        tables = a[4 * n + m :].reshape(self.s, self.w)
        return t, p, sl, ts, tables, rows  # StepInputs' field order

    def fill(self, inp: Any) -> None:
        """Copy host StepInputs `inp` in; rows past inp's are padding (see the module doc)."""
        t, p, sl, ts, tables, rows = self.views
        n, m, s = inp.tokens.shape[0], inp.logits_rows.shape[0], inp.block_tables.shape[0]
        w = min(self.w, inp.block_tables.shape[1])  # a table's blocks past the partitions are unread
        t[:n], p[:n], sl[:n], ts[:n] = inp.tokens, inp.positions, inp.slot_mapping, inp.token_seq
        rows[:m] = inp.logits_rows
        tables[:s, :w] = inp.block_tables[:, :w]
        if n < self.n:
            t[n:], p[n:], sl[n:], ts[n:] = 0, 0, -1, self.s - 1
        if m < self.m:
            rows[m:] = np.arange(m, self.m)
        if s < self.s or w < self.w:
            tables[s:] = 0
            tables[:s, w:] = 0

    def upload(self, stream: Any) -> None:
        self.dev.copy_to_device(self.host, stream=stream)


@dataclass(slots=True)
class StepGraph:
    """A recorded forward of `tokens` tokens with `parts` attention partitions: its persistent
    inputs, its launches, its result (a view of a shared buffer) and, on a device, the CUDA
    graph made of the launches."""

    tokens: int
    parts: int
    inputs: PackedInputs
    launches: list[Launch] = field(default_factory=list)
    output: Any = None
    graph: Any = None

    def recorder(self, kernel: Any, grid: Any, block: Any) -> Callable[..., None]:
        """A stand-in for `kernel[grid, block, stream]` that appends the launch instead."""

        def add(*args: Any) -> None:
            self.launches.append((kernel, grid, block, args))

        return add

    def build(self) -> None:
        """On a device: capture the launches into a CUDA graph (nothing runs until replay)."""
        if SIMULATOR:
            return
        try:
            from cuda.core import Device

            dev = Device()
            dev.set_current()
            builder = dev.create_graph_builder()
            builder.begin_building("relaxed")
            for kernel, grid, block, args in self.launches:
                kernel[grid, block, builder](*args)
            self.graph = builder.end_building().complete()
        except Exception as e:  # an older numba-cuda / cuda.core: replay launches the list instead
            log.warning("CUDA graph capture failed (%s: %s): replaying the recorded launches one by one",
                        type(e).__name__, e)
            self.graph = None

    def replay(self, stream: Any) -> None:
        """Run the recorded forward on `stream` (after its inputs were uploaded there)."""
        if self.graph is not None:
            from cuda.core import Stream

            self.graph.launch(Stream.from_handle(int(stream.handle)))
            return
        for kernel, grid, block, args in self.launches:
            kernel[grid, block, stream](*args)


class StepGraphs:
    """The recorded forwards of one backend by (tokens, partitions), and the buffers they share:
    replays run one at a time on one stream, so one logits buffer and one set of attention
    partials serve them all. A shared buffer that must grow, or a new workspace, drops every
    recorded forward (they hold the old addresses); they are recorded again when next needed."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.graphs: dict[tuple[int, int], StepGraph] = {}
        self.recording: StepGraph | None = None
        self.generation = 0  # bumped whenever recorded addresses become invalid
        self.replays = 0  # steps replayed so far (the tests' and benchmarks' check)
        self._shared: dict[str, Any] = {}

    def key(self, n_tokens: int, max_pos: int, replayable: bool) -> tuple[int, int] | None:
        b = bucket(n_tokens) if replayable and self.enabled else None
        return None if b is None else (b, parts_bucket(max_pos))

    def invalidate(self) -> None:
        self.graphs.clear()
        self.generation += 1

    def shared(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A view [shape] of the shared buffer `name`, grown (at least doubling its first axis)
        when too small; growing invalidates the recorded forwards."""
        buf = self._shared.get(name)
        if buf is None or len(buf.shape) != len(shape) or any(a < b for a, b in zip(buf.shape, shape)):
            old = buf.shape if buf is not None and len(buf.shape) == len(shape) else (0,) * len(shape)
            grown = (max(shape[0], 2 * old[0]),) + tuple(max(a, b) for a, b in zip(old[1:], shape[1:]))
            buf = self._shared[name] = cuda.device_array(grown, dtype)
            self.invalidate()
        return buf[tuple(slice(0, d) for d in shape)]
