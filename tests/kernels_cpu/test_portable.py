"""The kernels compiled for other CPUs than this one: a generic x86-64 target (SSE2 only, no F16C:
the half-precision intrinsics become library calls) and an AVX2-only one (haswell, no AVX-512).

Each target runs in a subprocess with its own numba cache directory under the edge-infer cache
(kernels_cpu/jit_cache.py's SourceTreeCacheLocator: reused while the kernel sources are
unchanged; the normal cache is neither read nor written) and checks, small: every row decoder bit-exact against the reference
dequantizer, matmuls against the NumPy twin, GEMV rows bit-identical to GEMM rows, paged
attention against dense attention (an f16 pool and a q4_0 one), and the fast-math activations.
Compilation dominates a cold run: 35-45 s per target on two busy cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from edge_infer.hub import cache_dir
from edge_infer.kernels_cpu.jit_cache import CACHE_LOCATORS

SUPPORT_DIR = Path(__file__).resolve().parents[1] / "support"

# numba uses the host's feature list with a named CPU unless NUMBA_CPU_FEATURES is given (the
# host's AVX-512 would then stay on), so the AVX2 target names its features explicitly.
HASWELL_FEATURES = (
    "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fxsr,+lzcnt,+mmx,+movbe,+popcnt,"
    "+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,-avx512f"
)

SCRIPT = textwrap.dedent(
    """
    import sys

    sys.path.insert(0, sys.argv[1])
    import numpy as np
    from numba.core import config
    from kernel_data import random_rows

    from edge_infer.kernels_cpu import dequant as dq
    from edge_infer.kernels_cpu import reference as ref
    from edge_infer.kernels_cpu.attention import store_kv_kernel
    from edge_infer.kernels_cpu.attention_tiles import paged_attention_kernel
    from edge_infer.kernels_cpu.matmul import matmul_kernel
    from edge_infer.kernels_cpu.ops import gelu_mul_kernel, silu_mul_kernel

    print("target", config.CPU_NAME, config.CPU_FEATURES, flush=True)
    rng = np.random.default_rng(0)

    for qtype in dq.KERNEL_TYPES:
        cols = max(dq.BLOCK_SHAPE[qtype][0], 32) * 2
        w = random_rows(qtype, 3, cols, rng)
        want = ref.decode_rows(w, qtype).view(np.uint32)
        out = np.empty(cols, np.float32)
        for r in range(3):
            dq.decode_row(qtype, w[r], out)
            assert np.array_equal(out.view(np.uint32), want[r]), ("decode", qtype, r)

    for qtype in (dq.Q4_K, dq.Q8_0, dq.F16):
        cols = 512
        w = random_rows(qtype, 11, cols, rng, edge=False)
        x = rng.standard_normal((5, cols)).astype(np.float32)
        got = np.full((5, 11), np.nan, np.float32)
        matmul_kernel(x, w, qtype, got, 2)
        scale = np.abs(x).astype(np.float64) @ np.abs(ref.decode_rows(w, qtype)).astype(np.float64).T
        assert np.all(np.abs(got - ref.matmul(x, w, qtype)) <= 1e-5 * scale + 1e-6), ("matmul", qtype)
        for t in range(5):
            alone = np.empty((1, 11), np.float32)
            matmul_kernel(x[t : t + 1], w, qtype, alone, 1)
            assert np.array_equal(alone[0], got[t]), ("gemv != gemm row", qtype, t)

    from edge_infer.kernels_cpu.backend import CpuBackend

    n_kv, rep, hd, bs = 2, 3, 64, 16
    for dtype in ("f16", "q4_0"):  # a float pool, and a block type stored Hadamard-rotated
        kc, ks, vc, vs = CpuBackend.make_kv_pool(None, 1, 6, bs, n_kv, hd, dtype)[0]
        tables = np.array([[4, 1, 3], [0, 5, 2]], np.int32)
        lens = (37, 20)
        for s, n in enumerate(lens):
            pos = np.arange(n)
            slots = tables[s, pos // bs].astype(np.int64) * bs + pos % bs
            k = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
            v = rng.standard_normal((n, n_kv * hd)).astype(np.float32)
            store_kv_kernel(k, v, slots, kc, ks, vc, vs)
        token_seq = np.array([0, 0, 0, 1], np.int32)
        positions = np.array([34, 35, 36, 19], np.int32)
        q = rng.standard_normal((4, n_kv * rep * hd)).astype(np.float32)
        out = np.full_like(q, np.nan)
        paged_attention_kernel(q, kc, ks, vc, vs, tables, token_seq, positions, np.float32(0.2), 0, np.float32(0.0), np.empty(0, np.float32), out, 2)
        want = ref.paged_attention(q, kc, ks, vc, vs, tables, token_seq, positions, 0.2, 0)
        np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
        alone = np.empty((1, q.shape[1]), np.float32)
        paged_attention_kernel(q[3:], kc, ks, vc, vs, tables, token_seq[3:], positions[3:], np.float32(0.2), 0,
                               np.float32(0.0), np.empty(0, np.float32), alone, 1)
        assert np.array_equal(alone[0], out[3]), ("attention batch invariance", dtype)

    g = np.concatenate([np.linspace(-30, 30, 997), [0.0, -0.0, 88.0, -100.0]]).astype(np.float32)
    g = np.ascontiguousarray(np.stack([g, g[::-1]]))
    u = rng.standard_normal(g.shape).astype(np.float32)
    out = np.empty_like(g)
    silu_mul_kernel(g, u, out)
    np.testing.assert_allclose(out, ref.silu_mul(g, u), rtol=1e-5, atol=1e-6)
    gelu_mul_kernel(g, u, out)
    np.testing.assert_allclose(out, ref.gelu_mul(g, u), rtol=1e-5, atol=1e-6)

    # the int8 matmul (Q8_0 output matrices): the plain-IR stand-in for vpdpbusd
    from check_i8 import check_i8

    check_i8(rng)
    from check_k import check_k  # the K-quant kernel (Q4_K, Q5_K, Q6_K): the same stand-in

    check_k(rng)

    # the target took effect: widest vector registers in the matmul loop (an uncached copy
    # compiled here for one of its signatures: a kernel loaded from the cache has no assembly)
    import numba
    from edge_infer.kernels_cpu._jit import NoAliasCompiler
    from edge_infer.kernels_cpu.matmul import _row_groups

    fresh = numba.njit(**_row_groups.targetoptions, pipeline_class=NoAliasCompiler)(_row_groups.py_func)
    # its signature as the matmul kernels call it (not _row_groups.signatures: with the callers
    # loaded from the cache, the helper itself was never compiled in this process)
    f32, u8 = numba.types.Array(numba.float32, 2, "C"), numba.types.Array(numba.uint8, 2, "C")
    sig = (f32, u8, numba.int64, f32, numba.int64, numba.int64, f32)
    fresh.compile(sig)
    asm = fresh.inspect_asm(sig)
    widest = "zmm" if "zmm" in asm else "ymm" if "ymm" in asm else "xmm"
    assert widest == sys.argv[2], ("vector width", widest, sys.argv[2])
    print("OK")
    """
)


def _run_for_target(tmp_path: Path, cpu_name: str, features: str | None, vector_reg: str) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") and k != "EDGE_INFER_NUMBA_DEFAULTS"
    }
    env["NUMBA_CPU_NAME"] = cpu_name
    if features is not None:
        env["NUMBA_CPU_FEATURES"] = features
    # a cache per target that outlives the run, keyed by the kernel sources' digest (so a
    # warm ~/.cache skips the compile, and any kernel change recompiles everything)
    env["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba-portable" / cpu_name)
    env["NUMBA_CACHE_LOCATOR_CLASSES"] = CACHE_LOCATORS
    env["NUMBA_NUM_THREADS"] = "2"
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(SUPPORT_DIR), vector_reg],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # a cold numba cache compiles every kernel for the target (~10 min on 2 cores)
    )
    assert p.returncode == 0 and p.stdout.rstrip().endswith("OK"), p.stdout[-3000:] + p.stderr[-6000:]


def test_kernels_on_generic_x86_64(tmp_path: Path) -> None:
    """Without F16C, LLVM lowers the half conversions of _jit.f16_to_f32 / f32_to_f16 to calls of
    __extendhfsf2 / __truncsfhf2, which numba's JIT must be able to resolve."""
    _run_for_target(tmp_path, "generic", None, "xmm")


def test_kernels_on_avx2_only(tmp_path: Path) -> None:
    _run_for_target(tmp_path, "haswell", HASWELL_FEATURES, "ymm")
