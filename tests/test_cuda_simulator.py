"""The CUDA kernels and the CUDA backend without a GPU: tests/kernels_cuda run in their own
pytest process under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 must be set before numba
is imported, so it cannot share this process; tests/support/simulator_run.py). test_ptx.py runs
here, in the main process.

The simulator is single-threaded Python for about five minutes, so it starts before the tests
and runs beside them: under pytest-xdist the controller starts it (conftest.py's
pytest_configure) and this file is handed out last, to wait for it; without xdist, collection
starts it (pytest_collection_finish)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import simulator_run

NEEDS = importlib.util.find_spec("numba_cuda") is not None
_local: list[Path] = []


def start_simulator() -> None:
    """Start the simulator in this process's own folder (once)."""
    if _local or not NEEDS:
        return
    _local.append(simulator_run.start())


@pytest.mark.skipif(not NEEDS, reason="needs the [cuda] extra")
def test_cuda_kernels_and_engine_under_the_simulator() -> None:
    shared = os.environ.get(simulator_run.DIR_ENV)
    if shared and (Path(shared) / "started").exists():
        folder = Path(shared)  # started by the xdist controller
    else:
        start_simulator()  # when run alone, or collected without the hook
        folder = _local[0]
    # 351 s on CI's AVX-512 machine beside the other worker; a 2-core AVX2 Zen 3 VM with cold
    # kernel caches ran past 900 s, so the bound leaves room for slower hosts
    rc, out = simulator_run.wait(folder, timeout=1800)
    tail = out[-6000:]
    assert rc == 0, f"exit status {rc} (-1: still running after 1800 s)\n{tail}"
    lines = out.strip().splitlines()
    assert " passed" in out and lines and "skipped" not in lines[-1], tail
