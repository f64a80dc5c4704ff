"""A step's logits as the sampler reads them: whole rows where a sequence needs the vocabulary
(sampling, penalties, grammars, logprobs) and each row's argmax, which a backend may compute
where the logits are (CUDA: on the device, so a greedy row crosses as one int)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.errors import GenerationError

NON_FINITE_LOGITS = "the model produced NaN or infinite logits (its weights or activations overflowed)"


@dataclass(slots=True)
class StepLogits:
    """rows float32 [H, V] on the host; where int [M]: row i's index in rows, -1 when it was not
    copied (None: rows holds all M rows in order); greedy int32 [M]: every row's argmax (None:
    taken from rows when asked)."""

    rows: np.ndarray
    where: np.ndarray | None = None
    greedy: np.ndarray | None = None

    def row(self, i: int) -> np.ndarray:
        """Row i's logits float32 [V] (only rows marked whole when the step ran are here)."""
        if self.where is None:
            return self.rows[i]
        j = int(self.where[i])
        if j < 0:
            raise LookupError(f"logit row {i} was not copied to the host (it was marked argmax-only)")
        return self.rows[j]

    def argmax(self, i: int) -> int:
        """Row i's greedy token: the lowest index of its maximum, as np.argmax (GenerationError
        when that is not a finite logit: the model's output overflowed or is NaN)."""
        if self.greedy is not None:
            return int(self.greedy[i])
        row = self.row(i)
        tok = int(np.argmax(row))
        if not np.isfinite(row[tok]):
            raise GenerationError(NON_FINITE_LOGITS)
        return tok
