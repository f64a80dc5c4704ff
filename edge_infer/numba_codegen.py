"""numba's code-generation settings for every compiled function of the package, applied on
import, before the first numba function is defined: numba builds its CPU target machine once,
at the first `@njit` it sees (a decorator, not a call), and reads these settings only then. So
every module that defines numba functions imports this one first (kernels_cpu/_jit.py, and
formats/quant_fit*.py, which the engine imports long before the kernels); a process whose first
numba function came from elsewhere would compile every kernel with 256-bit vectors.

- `-prefer-256-bit` off on AVX-512 hosts: LLVM may use full 512-bit vectors (it defaults to 256).
- SLP vectorization on: small fixed-size block loops are fully unrolled before the loop
  vectorizer sees them; the SLP pass turns the unrolled code back into vector code.
Set EDGE_INFER_NUMBA_DEFAULTS to keep numba's own defaults (debugging code generation).
It also locks numba's cache saves (numba_cache.py), before any kernel can be compiled and saved.
"""

from __future__ import annotations

import os

from numba.core import config

from edge_infer.numba_cache import lock_cache_saves


def configure() -> None:
    """Apply the settings (idempotent; too late once numba has built its target machine)."""
    if os.environ.get("EDGE_INFER_NUMBA_DEFAULTS"):
        return
    config.SLP_VECTORIZE = 1  # type: ignore[attr-defined]
    if config.CPU_FEATURES is None and (config.CPU_NAME or "").lower() != "generic":  # type: ignore[attr-defined]
        from numba.core.codegen import get_host_cpu_features

        feats = get_host_cpu_features()
        if "+avx512f" in feats:
            config.CPU_FEATURES = feats + ",-prefer-256-bit"  # type: ignore[attr-defined]


configure()
lock_cache_saves()
