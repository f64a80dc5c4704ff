"""The CUDA kernels and the CUDA backend without a GPU: tests/kernels_cuda run in their own
pytest process under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 must be set before numba
is imported, so it cannot share this process). test_ptx.py runs here, in the main process.

The simulator is single-threaded Python for about four minutes, so the process starts as soon
as collection has selected this test (`start_simulator`, called from conftest.py's
pytest_collection_finish) and runs beside the tests before it; this test waits for it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEEDS = importlib.util.find_spec("numba_cuda") is not None
_started: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []


def start_simulator() -> None:
    """Start the simulator's pytest process (once; its output goes to a temporary file)."""
    if _started or not NEEDS:
        return
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels_cuda",
           "-k", "not test_kernel_compiles_to_ptx"]
    log = tempfile.TemporaryFile()
    _started.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))


@pytest.mark.skipif(not NEEDS, reason="needs the [cuda] extra")
def test_cuda_kernels_and_engine_under_the_simulator() -> None:
    start_simulator()  # when run alone, or collected without the hook
    proc, log = _started[0]
    try:
        # 351 s on CI's AVX-512 machine beside the other worker; a 2-core AVX2 Zen 3 VM with cold
        # kernel caches ran past 900 s, so the bound leaves room for slower hosts
        proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log.seek(0)
    out = log.read().decode(errors="replace")
    tail = out[-6000:]
    assert proc.returncode == 0, tail
    lines = out.strip().splitlines()
    assert " passed" in out and lines and "skipped" not in lines[-1], tail
