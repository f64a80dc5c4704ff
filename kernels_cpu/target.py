"""What the CPU kernels are compiled for: LLVM's CPU name, the instruction-set features the
kernels choose code by, and which matmul path each GGUF weight type takes on this target
(what `edge-infer doctor` reports)."""

from __future__ import annotations

import platform

from numba.core import config

from edge_infer.formats.weight_types import TYPES

from ._jit import target_has
from .backend import I8_TYPES, K_TYPES
from .simd_isa import HAS_AVX2_DOT, HAS_SDOT, HAS_VNNI

# The LLVM features the kernels' code depends on: the int8 dot products (VNNI, AVX2 or sdot, else
# plain vector IR that LLVM lowers with what the target has), 512-bit vectors, F16C half conversions.
X86_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avxvnni", "amx-int8")
ARM_FEATURES = ("neon", "dotprod", "fullfp16", "i8mm")


def is_x86() -> bool:
    """Whether this machine is x86-64 (or 32-bit x86)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def cpu_name() -> str:
    """The CPU LLVM compiles for: NUMBA_CPU_NAME when set, else the host's (e.g. "znver4")."""
    if config.CPU_NAME:  # type: ignore[attr-defined]
        return str(config.CPU_NAME)  # type: ignore[attr-defined]
    import llvmlite.binding as llvm

    return str(llvm.get_host_cpu_name())


def features() -> dict[str, bool]:
    """Each feature the kernels care about on this architecture -> whether the target has it."""
    names = X86_FEATURES if is_x86() else ARM_FEATURES
    return {f: target_has("+" + f) for f in names}


def int8_isa() -> str:
    """How the int8 dot products are computed: "AVX-512 VNNI" (vpdpbusd), "AVX2" (vpmaddubsw +
    vpmaddwd, also on AVX-512 CPUs without VNNI), "NEON sdot" (aarch64 CPUs with the
    dot-product extension), or the plain vector IR lowered by LLVM ("NEON", "generic")."""
    if HAS_VNNI:
        return "AVX-512 VNNI"
    if HAS_SDOT:
        return "NEON sdot"
    if not is_x86():
        return "NEON" if platform.machine().lower() in ("aarch64", "arm64") else "generic"
    return "AVX2" if HAS_AVX2_DOT else "generic"


FLOAT_PATH = "float (blocks decoded to float32)"


def matrix_path(qtype: int, cols: int, role: str = "layer") -> str:
    """The matmul path of one matrix (GGML type id, row length, role "layer" | "output"), as
    CpuBackend.prepare_weights decides it: the int8 kernel for a type whose int8 form takes the
    role (4-, 5- and 8-bit layer matrices, a Q8_0 output) with rows of whole 32-blocks, the
    K-quant int8 kernel for a type with a K-quant form with rows of whole 256-blocks, else the
    float path (formats.weight_types holds each type's forms)."""
    isa = int8_isa()
    if qtype in I8_TYPES[role] and cols % 32 == 0:
        return f"int8 {isa}"
    if qtype in K_TYPES and cols % 256 == 0:
        return f"int8 {isa} (K-quant kernel)"
    return FLOAT_PATH


def matmul_paths() -> dict[str, str]:
    """GGUF weight type name -> the path a layer matrix of it takes here (rows a multiple of
    256 wide), e.g. {"Q4_K": "int8 AVX-512 VNNI (K-quant kernel)", "F16": "float (...)"}."""
    return {t.name: matrix_path(t.id, 256) for t in TYPES}


def numpy_blas() -> dict[str, object] | None:
    """NumPy's BLAS as threadpoolctl sees it (library, version, the kernels it runs with, its
    threads) and OPENBLAS_CORETYPE when the environment sets it: the vision towers' float
    products run on it (OpenBLAS's own choice on an AVX-512 CPU is SkylakeX; a forced Haswell
    halves their speed). None when threadpoolctl finds no BLAS."""
    import os

    import numpy  # noqa: F401  (loads its BLAS)
    from threadpoolctl import threadpool_info

    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return {"api": lib.get("internal_api"), "version": lib.get("version"),
                    "kernels": lib.get("architecture"), "threads": lib.get("num_threads"),
                    "coretype_env": os.environ.get("OPENBLAS_CORETYPE")}
    return None


def format_numpy_blas(info: dict[str, object] | None) -> str:
    """One line: 'openblas 0.3.31, Haswell kernels (OPENBLAS_CORETYPE=Haswell), 2 threads'."""
    if info is None:
        return "not found"
    env = f" (OPENBLAS_CORETYPE={info['coretype_env']} in the environment)" if info["coretype_env"] else ""
    kern = f", {info['kernels']} kernels" if info["kernels"] else ""
    return f"{info['api']} {info['version']}{kern}{env}, {info['threads']} threads"
