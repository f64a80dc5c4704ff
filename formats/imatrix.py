"""Importance matrices: per weight matrix, the sum of each input channel's squared activation
over calibration text and the number of rows summed, in llama.cpp's imatrix GGUF format (what
`llama-imatrix` writes and `llama-quantize --imatrix` reads), so files go both ways.

Format: `general.type = "imatrix"`, `imatrix.datasets` (string array), `imatrix.chunk_count`,
`imatrix.chunk_size` (u32); for each weight W two F32 tensors: `W.in_sum2` of GGUF shape
[n_in, n_mat] and `W.counts` of shape [1, n_mat] (n_mat: 1, or the number of experts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.errors import EdgeInferError
from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.formats.gguf import GGUFFile

SUM2, COUNTS = ".in_sum2", ".counts"


class ImatrixError(EdgeInferError):
    """An importance-matrix file that cannot be read or does not fit the model."""


@dataclass
class Imatrix:
    """sums[name]: float64 [n_mat, n_in] summed squared activations; counts[name]: float64
    [n_mat] rows summed per matrix (per expert for a stack)."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0

    def add(self, name: str, x2: np.ndarray, rows: int, mat: int = 0, n_mat: int = 1) -> None:
        """Accumulate x2 float [n_in] (a sum over `rows` activation rows) for matrix `mat`."""
        s = self.sums.get(name)
        if s is None:
            s = self.sums[name] = np.zeros((n_mat, x2.shape[0]), np.float64)
            self.counts[name] = np.zeros(n_mat, np.float64)
        s[mat] += x2
        self.counts[name][mat] += rows

    def importance(self, name: str, n_in: int) -> np.ndarray | None:
        """Mean squared activation float32 [n_mat, n_in] of the weight `name`, or None when the
        file has no entry for it; an entry of another width is an ImatrixError."""
        s = self.sums.get(name)
        if s is None:
            return None
        if s.shape[1] != n_in:
            raise ImatrixError(f"importance matrix entry {name!r} has {s.shape[1]} input channels, "
                               f"the model's tensor has {n_in}")
        c = self.counts[name]
        return (s / np.where(c > 0, c, 1)[:, None]).astype(np.float32)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the imatrix GGUF atomically (a temporary file in the same folder, renamed)."""
        from gguf import GGUFWriter

        dest = Path(path)
        tmp = temp_beside(dest)
        try:
            w = GGUFWriter(tmp, arch="", use_temp_file=False)
            w.kv_data[0].pop("general.architecture", None)  # an imatrix file names no architecture
            w.add_type("imatrix")
            w.add_array("imatrix.datasets", self.datasets or ["unknown"])
            w.add_uint32("imatrix.chunk_count", self.chunk_count)
            w.add_uint32("imatrix.chunk_size", self.chunk_size)
            for name in sorted(self.sums):
                w.add_tensor(name + SUM2, self.sums[name].astype(np.float32))
                w.add_tensor(name + COUNTS, self.counts[name].astype(np.float32).reshape(-1, 1))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            commit(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Imatrix:
        """Read an imatrix GGUF (llama-imatrix's format or ours)."""
        with GGUFFile(path) as f:
            kind = f.metadata.get("general.type")
            if kind != "imatrix":
                raise ImatrixError(f"{path}: not an importance matrix (general.type is {kind!r}, expected 'imatrix'); "
                                   "the legacy .dat format is not read: convert it with llama-imatrix --in-file")
            datasets = f.metadata.get("imatrix.datasets", [])
            if not isinstance(datasets, list):
                raise ImatrixError(f"{path}: imatrix.datasets must be an array of strings, got {datasets!r}")
            out = cls(datasets=[str(d) for d in datasets], chunk_count=_count(f, "imatrix.chunk_count"),
                      chunk_size=_count(f, "imatrix.chunk_size"))
            for tname, t in f.tensors.items():
                if not tname.endswith(SUM2):
                    continue
                name = tname[: -len(SUM2)]
                c = f.tensors.get(name + COUNTS)
                if c is None:
                    raise ImatrixError(f"{path}: {tname} has no {name + COUNTS} beside it")
                for x in (t, c):  # llama-imatrix writes F32 only; other bytes are not floats
                    if x.type != GGMLQuantizationType.F32:
                        raise ImatrixError(f"{path}: tensor {x.name} has type {x.type.name}, expected F32")
                sums = np.array(t.data.view(np.float32), np.float64)
                counts = np.array(c.data.view(np.float32), np.float64).reshape(-1)
                # [n_in, n_mat]; llama-imatrix's single-matrix entries are stored 1-D
                if len(t.shape) > 2 or counts.size == 0 or sums.size % counts.size or t.shape[0] * counts.size != sums.size:
                    raise ImatrixError(f"{path}: {tname} of shape {list(t.shape)} does not match "
                                       f"{name + COUNTS} of shape {list(c.shape)}")
                sums = sums.reshape(counts.size, -1)
                if not np.isfinite(sums).all() or (sums < 0).any():
                    raise ImatrixError(f"{path}: {tname} has negative or non-finite values")
                out.sums[name], out.counts[name] = sums, counts
        if not out.sums:
            raise ImatrixError(f"{path}: the importance matrix has no entries")
        return out


def _count(f: GGUFFile, key: str) -> int:
    """A non-negative integer metadata value (0 when absent), or ImatrixError naming the key."""
    v = f.metadata.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ImatrixError(f"{f.path}: {key} must be a non-negative integer, got {v!r}")
    return v
