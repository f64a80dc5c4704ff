"""Whether this test process runs numba's CUDA simulator (or has a real GPU) (NUMBA_ENABLE_CUDASIM=1, set only in
the process tests/test_cuda_simulator.py starts) and has numba-cuda (the [cuda] extra)."""

from __future__ import annotations

import importlib.util
import sys

HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
SIMULATOR = False
if HAS_NUMBA_CUDA:
    from numba.core import config

    SIMULATOR = bool(config.ENABLE_CUDASIM)
HAS_GPU = False  # a real device (scripts/cuda_check.sh runs the same tests there)
if HAS_NUMBA_CUDA and not SIMULATOR:
    try:
        from numba import cuda

        HAS_GPU = bool(cuda.is_available())
    except Exception:  # no driver
        HAS_GPU = False
ON_CUDA = SIMULATOR or HAS_GPU
if SIMULATOR:
    # The simulator runs a Python thread per CUDA thread and hands the GIL over at every
    # barrier: the default 5 ms switch interval would make each barrier cost milliseconds.
    sys.setswitchinterval(1e-5)
