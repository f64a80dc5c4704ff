"""The vision towers' float products: NumPy's BLAS with one thread of its own per call, the
calls split over a pool of the backend's thread count.

Why not BLAS's own threads: OpenBLAS's idle workers spin for a while after each product, and
numba's OpenMP threads spin after each of the tower's parallel kernels (norms, GELU); on a
machine with as many cores as threads the two pools took turns starving each other. On the
engine thread a 512 px tile pair took 4.0 s instead of 1.2 s (2 cores; every part slower, the
softmax 15x). With BLAS limited to one thread (threadpoolctl, for the tower's call only) and
the products split here by rows (a matrix) or by heads (attention), the pool's threads wait
without spinning and the tower runs as fast on the engine thread as anywhere.

A split depends only on the tile's rows and the thread count, never on other tiles: a tile's
embeddings stay independent of the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.models.backend import EncoderBackend

SCORE_BUDGET = 1 << 23  # float32 scores one thread holds at once (32 MiB): a head's queries in blocks past it


class VisionBlas:
    """Row- and head-split products over n_threads pool threads (the calling thread waits)."""

    def __init__(self, backend: EncoderBackend, n_threads: int, score_budget: int = SCORE_BUDGET) -> None:
        self.b, self.n = backend, max(1, n_threads)
        self.score_budget = score_budget
        self._pool: ThreadPoolExecutor | None = None
        self._controller: Any = None  # threadpoolctl's, made at the first image
        self._wide = np.empty(0, np.float32)

    @contextmanager
    def one_thread_each(self) -> Iterator[None]:
        """BLAS limited to one thread per call for the block's duration (restored after)."""
        if self._controller is None:
            from threadpoolctl import ThreadpoolController  # only a tower needs it

            self._controller = ThreadpoolController()
        with self._controller.limit(limits=1, user_api="blas"):
            yield

    def _spans(self, total: int) -> list[tuple[int, int]]:
        """0 .. total cut into (start, end) runs, one per thread, empty ones left out."""
        cuts = [total * i // self.n for i in range(self.n + 1)]
        return [(a, z) for a, z in zip(cuts, cuts[1:]) if z > a]

    def _run(self, parts: list[Callable[[], object]]) -> None:
        if len(parts) == 1:
            parts[0]()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.n, thread_name_prefix="edge-infer-vision")
        for f in [self._pool.submit(p) for p in parts]:
            f.result()

    def matmul(self, x: np.ndarray, wt: np.ndarray, out: np.ndarray) -> None:
        """out [M, N] = x [M, K] @ wt [K, N], rows split evenly over the threads."""
        self._run([partial(np.matmul, x[a:z], wt, out=out[a:z]) for a, z in self._spans(x.shape[0])])

    def widened(self, m: QMatrix) -> np.ndarray:
        """A float matrix (F16, BF16) as float32 [rows, cols] (exact) in a buffer reused by the
        next call, its rows converted over the threads by the backend (a tile's products widen
        every matrix: with NumPy's cast, on one thread, a fifth of an F16 tower's time)."""
        size = m.rows * m.cols
        if self._wide.size < size:
            self._wide = np.empty(size, np.float32)
        out, data = self._wide[:size].reshape(m.rows, m.cols), m.data.reshape(m.rows, -1)
        self._run([partial(self.b.widen_rows, m.qtype, data, a, z, out[a:z]) for a, z in self._spans(m.rows)])
        return out

    def attention(self, scaled: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, n_heads: int,
                  head_dim: int) -> None:
        """out[:, h] = softmax(scaled[:, h] k[:, h]^T) v[:, h] per head h (scaled: q times the
        scale; all float32 [n, n_heads * head_dim]), the heads split over the threads, each with
        its own [n, n] scores."""
        self._run([partial(self._heads, scaled, k, v, out, range(a, z), head_dim) for a, z in self._spans(n_heads)])

    def _heads(self, scaled: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray, heads: range,
               hd: int) -> None:
        n = scaled.shape[0]
        # one head at a time, its queries in blocks of rows within the score budget (Qwen2.5-VL's
        # largest image is 16,384 patches: 1 GiB of scores for a whole head)
        rows = max(1, min(n, self.score_budget // n))
        scores = np.empty((rows, n), np.float32)
        inv, head = np.empty(rows, np.float32), np.empty((rows, hd), np.float32)
        for h in heads:
            cols = slice(h * hd, (h + 1) * hd)
            kt, vh = k[:, cols].T, v[:, cols]
            for a in range(0, n, rows):
                z = min(n, a + rows)
                sc, iv, hs = scores[: z - a], inv[: z - a], head[: z - a]
                np.matmul(scaled[a:z, cols], kt, out=sc)
                self.b.softmax_rows(sc, iv)  # max, exp and sum in one pass pair
                np.matmul(sc, vh, out=hs)
                np.multiply(hs, iv[:, None], out=out[a:z, cols])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

