"""Importance-matrix files: ours round-trip, and llama-imatrix's layout (a single matrix's sums
stored 1-D, an expert stack's [n_in, n_mat]) reads the same; a bad file is one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from edge_infer.formats.imatrix import Imatrix, ImatrixError


def _llama_style(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]]) -> Path:
    w = GGUFWriter(str(path), arch="")
    w.kv_data[0].pop("general.architecture", None)
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["calib.txt"])
    w.add_uint32("imatrix.chunk_count", 3)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        w.add_tensor(name + ".in_sum2", sums.astype(np.float32))
        w.add_tensor(name + ".counts", counts.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_round_trip(tmp_path: Path) -> None:
    im = Imatrix(datasets=["a.txt"], chunk_count=2, chunk_size=256)
    x2 = np.arange(1, 9, dtype=np.float64)
    im.add("blk.0.attn_q.weight", x2, 4)
    im.add("blk.0.attn_q.weight", x2, 4)
    for e in range(3):
        im.add("blk.0.ffn_up_exps.weight", x2 * (e + 1), 2, e, 3)
    im.save(tmp_path / "i.gguf")
    back = Imatrix.load(tmp_path / "i.gguf")
    assert back.datasets == ["a.txt"] and (back.chunk_count, back.chunk_size) == (2, 256)
    assert np.allclose(back.importance("blk.0.attn_q.weight", 8), x2 / 4)
    assert np.allclose(back.importance("blk.0.ffn_up_exps.weight", 8)[2], 3 * x2 / 2)
    assert back.importance("blk.9.attn_q.weight", 8) is None
    with pytest.raises(ImatrixError, match="has 8 input channels, the model's tensor has 16"):
        back.importance("blk.0.attn_q.weight", 16)
    assert [p.name for p in tmp_path.iterdir()] == ["i.gguf"]  # no temporary file left


def test_llama_imatrix_layout_reads_the_same(tmp_path: Path) -> None:
    one = np.arange(1, 5, dtype=np.float32)
    stack = np.arange(12, dtype=np.float32).reshape(3, 4)  # numpy (n_mat, n_in) = GGUF [n_in, n_mat]
    p = _llama_style(tmp_path / "l.gguf", {"a.weight": (one, np.array([2.0])),
                                           "b.weight": (stack, np.array([[1.0], [2.0], [4.0]]))})
    im = Imatrix.load(p)
    assert np.allclose(im.importance("a.weight", 4), one[None] / 2)
    assert np.allclose(im.importance("b.weight", 4), stack / np.array([[1.0], [2.0], [4.0]]))


def test_bad_files_are_refused(tmp_path: Path) -> None:
    p = _llama_style(tmp_path / "bad.gguf", {"a.weight": (np.arange(5, dtype=np.float32), np.array([1.0, 2.0]))})
    with pytest.raises(ImatrixError, match="does not match a.weight.counts"):
        Imatrix.load(p)
    p = _llama_style(tmp_path / "neg.gguf", {"a.weight": (-np.ones(4, np.float32), np.array([1.0]))})
    with pytest.raises(ImatrixError, match="negative or non-finite"):
        Imatrix.load(p)
    with pytest.raises(ImatrixError, match="no entries"):
        Imatrix.load(_llama_style(tmp_path / "empty.gguf", {}))
