"""llama.cpp (llama-cpp-python's Llama) on a converted BERT GGUF: its tokens and its pooled,
L2-normalised embeddings, with the file's own pooling unless one is given."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest


class LlamaBert:
    """One embeddings context over `path` (two threads, or the one per xdist worker)."""

    def __init__(self, path: Path, n_ctx: int = 512, pooling: int | None = None) -> None:
        lc = pytest.importorskip("llama_cpp")
        threads = int(os.environ.get("NUMBA_NUM_THREADS", "2"))
        opts: dict[str, Any] = {"embedding": True, "verbose": False, "n_ctx": n_ctx, "n_batch": n_ctx,
                                "n_ubatch": n_ctx, "n_threads": threads, "n_threads_batch": threads}
        if pooling is not None:
            opts["pooling_type"] = pooling
        self.llm = lc.Llama(str(path), **opts)

    def tokens(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=True, special=False))

    def embed(self, text: str) -> np.ndarray:
        return np.asarray(self.llm.embed(text, normalize=True), np.float64)

    def scores(self, text: str, n: int) -> np.ndarray:
        """A RANK context's n classifier outputs (llama-cpp-python reads a whole embedding's width)."""
        return np.asarray(self.llm.embed(text, normalize=False)[:n], np.float64)

    def close(self) -> None:
        self.llm.close()
