"""Every CUDA kernel compiles to PTX for sm_90 (numba.cuda.compile_ptx: NVRTC and libNVVM from
the [cuda] extra's wheels, no GPU needed). This catches what the simulator cannot: typing
errors, unsupported operations, the inline-PTX dp4a."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None, reason="needs the [cuda] extra")


def _cases() -> list:
    if importlib.util.find_spec("numba_cuda") is None:
        return []
    from numba.core import config

    if config.ENABLE_CUDASIM:  # the simulator's process: its kernels are Python, nothing to compile
        return []
    from cuda_kernel_signatures import signatures

    return signatures()


@pytest.mark.parametrize(("name", "kernel", "sig"), _cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_compiles_to_ptx_for_sm90(name: str, kernel: object, sig: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from numba import cuda
    from numba.cuda import dispatcher

    # numba-cuda compiles a called device function for the current device's compute capability,
    # which needs a driver; this machine has none, so name sm_90 for it as compile_ptx does.
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(compute_capability=(9, 0)))

    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))  # type: ignore[attr-defined]
    assert ".target sm_90" in ptx
    if name == "matmul_codes":
        assert "dp4a.s32.s32" in ptx  # the integer dot product, not a byte loop
