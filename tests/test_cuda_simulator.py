"""The CUDA kernels and the CUDA backend without a GPU: tests/kernels_cuda run in their own
pytest process under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1 must be set before numba
is imported, so it cannot share this process). test_ptx.py runs here, in the main process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None, reason="needs the [cuda] extra")
def test_cuda_kernels_and_engine_under_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels_cuda",
           "-k", "not test_kernel_compiles_to_ptx"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (p.stdout + p.stderr)[-6000:]
    assert p.returncode == 0, tail
    assert " passed" in p.stdout and "skipped" not in p.stdout.splitlines()[-1], tail
