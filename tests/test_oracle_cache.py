"""tests/support/oracle_cache.py, which keeps the oracles' results between runs: a result is
computed once and read back, a damaged file is computed again, a quick result is not kept, and
the folder is pruned of the unused and of the least recently read past its cap."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import oracle_cache as oc
import pytest


@pytest.fixture(autouse=True)
def oracle_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGE_INFER_CACHE", str(tmp_path))
    monkeypatch.setattr(oc, "KEEP_FROM_S", 0.0)
    return tmp_path


def test_a_result_is_computed_once_and_read_back_and_a_damaged_one_again(oracle_dir: Path) -> None:
    calls = []

    def compute() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"x": np.arange(5.0), "y": np.ones((2, 3), np.float32)}

    first = oc.cached_arrays("k", ("a", [1, 2]), compute)
    again = oc.cached_arrays("k", ("a", [1, 2]), compute)
    oc.cached_arrays("k", ("a", [1, 3]), compute)  # other inputs: computed
    assert len(calls) == 2
    assert all(np.array_equal(first[n], again[n]) and first[n].dtype == again[n].dtype for n in first)
    files = sorted((oracle_dir / "oracle" / "k").glob("*.npz"))
    assert len(files) == 2 and not list((oracle_dir / "oracle" / "k").glob(".*"))  # no temporary left
    for f in files:
        f.write_bytes(f.read_bytes()[:50])  # truncated
    assert np.array_equal(oc.cached_arrays("k", ("a", [1, 2]), compute)["x"], first["x"]) and len(calls) == 3


def test_a_quick_result_is_not_kept(oracle_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oc, "KEEP_FROM_S", 60.0)
    oc.cached_arrays("k", ("b",), lambda: {"x": np.zeros(3)})
    assert not list(oracle_dir.rglob("*.npz"))


def test_prune_drops_the_unused_then_the_least_recently_read_past_the_cap(tmp_path: Path) -> None:
    files = []
    for i, age_days in enumerate((40, 3, 2, 1)):
        f = tmp_path / f"{i}.npz"
        f.write_bytes(b"x" * 100)
        t = time.time() - age_days * 86400
        os.utime(f, (t, t))
        files.append(f)
    oc._prune(tmp_path, cap=250)
    assert [f.exists() for f in files] == [False, False, True, True]
