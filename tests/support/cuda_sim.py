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


def _lock_shared_allocation() -> None:
    """numba's simulator makes a block's shared array when the first of its threads reaches the
    `cuda.shared.array` line, checking and filling its table without a lock: two threads that
    reach the line together can each get their own "shared" array, and the block's reduction
    then reads values never written (a rare, timing-dependent wrong result; more likely with
    the short switch interval below). The same lookup, under a lock."""
    import threading
    import traceback

    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):  # type: ignore[no-untyped-def]
        if shape == 0 or alignment is not None:  # dynamic shared memory, or the simulator's error
            return original(self, shape, dtype, alignment)
        caller = traceback.extract_stack(sys._getframe())[-2][0:2]  # the kernel's line, as numba keys it
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                dt = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
                res = self._allocations[caller] = np.empty(shape, dt)
        return res

    kernelapi.FakeCUDAShared.array = array


if SIMULATOR:
    # The simulator runs a Python thread per CUDA thread and hands the GIL over at every
    # barrier: the default 5 ms switch interval would make each barrier cost milliseconds.
    sys.setswitchinterval(1e-5)
    _lock_shared_allocation()
