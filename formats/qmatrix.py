"""QMatrix: a 2-D weight as a backend computes with it: the GGUF blocks of each row, plus the
backend's own prepared copy when it made one (kernels_cpu: the int8 kernel's repacked layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class QMatrix:
    """A [rows, cols] weight in GGUF block layout: data is uint8 [rows, row_bytes] (a view of
    the mmap'd file), qtype the GGML type id. packed: None, or the backend's prepared form,
    which then computes every product with this matrix (data is kept for row lookups: tied
    embeddings). A stack of a mixture-of-experts layer's experts has data uint8 [E, rows,
    row_bytes]: expert e is the [rows, cols] matrix data[e]."""

    name: str
    data: np.ndarray
    qtype: int
    rows: int
    cols: int
    packed: Any = None

    @property
    def compute_nbytes(self) -> int:
        """Bytes one product with the matrix reads: its prepared form's, else its GGUF blocks'."""
        return int(self.packed.nbytes) if self.packed is not None else int(self.data.nbytes)

    @property
    def n_experts(self) -> int:
        """Experts in a stack, 0 for a plain matrix."""
        return int(self.data.shape[0]) if self.data.ndim == 3 else 0
