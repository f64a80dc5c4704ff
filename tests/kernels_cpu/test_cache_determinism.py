"""A kernel gives the same bits whether this process compiled it or loaded it from numba's cache.

numba links a called function (and a parallel loop's body) into its caller twice over: as its
own compiled copy, which a process that compiled the caller runs, and re-optimized inside the
caller's object code, which a process that loaded the caller from the cache runs. With
fastmath's `contract` or `nsz` the two copies rounded differently (paged attention from 32 keys
on; smollm2's logits moved by up to 2 in a first run against a second). Two subprocesses share
one fresh cache directory: the first compiles and runs the float kernels called from parallel
loops, the second loads them and runs them on the same inputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from edge_infer.kernels_cpu.attention_tiles import paged_attention_kernel
    from edge_infer.kernels_cpu.matmul import matmul_kernel
    from edge_infer.kernels_cpu.moe import route_kernel

    rng = np.random.default_rng(0)
    out = {}
    # paged attention: 3 kv-heads of 3 queries each, f32 pool, 80 positions (five 16-slot blocks)
    n, hd, bs = 80, 64, 16
    q = rng.standard_normal((n, 9 * hd)).astype(np.float32)
    kc = rng.standard_normal((5, 3, hd, bs)).astype(np.float32)  # K blocks transposed
    vc = rng.standard_normal((5, bs, 3, hd)).astype(np.float32)
    none = np.empty((0, 0, 0), np.float32)
    att = np.zeros((n, 9 * hd), np.float32)
    paged_attention_kernel(q, kc, none, vc, none, np.arange(5, dtype=np.int32)[None], np.zeros(n, np.int32),
                           np.arange(n, dtype=np.int32), np.float32(0.125), 0, np.float32(0.0), np.empty(0, np.float32), att, 2)
    out["attention"] = att
    # F16 GEMM and GEMV (K not a multiple of the vector width: the loop tails run too)
    w = rng.standard_normal((40, 200)).astype(np.float16).view(np.uint8)
    for t in (1, 9):
        mm = np.zeros((t, 40), np.float32)
        matmul_kernel(rng.standard_normal((t, 200)).astype(np.float32), w, 1, mm, 2)
        out[f"matmul{t}"] = mm
    # MoE routing from an F32 router, on the parallel path (>= SERIAL_TOKENS tokens)
    t, e, d, k = 12, 8, 100, 2
    x = rng.standard_normal((t, d)).astype(np.float32)
    logits, sel, wts = np.zeros((t, e), np.float32), np.zeros((t, k), np.int32), np.zeros((t, k), np.float32)
    route_kernel(logits, rng.standard_normal((e, d)).astype(np.float32), True, 0, np.zeros(0, np.float32), x, sel, wts,
                 np.zeros(e + 1, np.int32), np.zeros(t * k, np.int32), np.zeros((t, k), np.int32),
                 np.zeros((t * k, d), np.float32))
    out["router_logits"], out["route_weights"] = logits, wts
    hits = sum(f.stats.cache_hits.total() for f in (paged_attention_kernel, matmul_kernel, route_kernel))
    np.savez(sys.argv[1], hits=hits, **out)
    """
)


def _run(tmp_path: Path, name: str, cache: Path) -> dict[str, np.ndarray]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_CACHE_DIR"] = str(cache)
    env["NUMBA_NUM_THREADS"] = "2"
    dest = tmp_path / f"{name}.npz"
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(dest)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    with np.load(dest) as z:
        return dict(z)


def test_a_cold_compile_and_a_cache_load_give_the_same_bits(tmp_path: Path) -> None:
    cache = tmp_path / "numba-cache"
    compiled = _run(tmp_path, "compiled", cache)
    loaded = _run(tmp_path, "loaded", cache)
    assert compiled.pop("hits") == 0, "the first process must compile (its cache directory was empty)"
    assert loaded.pop("hits") > 0, "the second process must load the kernels from the cache"
    for name, value in compiled.items():
        diff = np.abs(value.astype(np.float64) - loaded[name]).max()
        assert np.array_equal(value, loaded[name]), (
            f"{name}: compiled and cache-loaded differ by up to {diff:.3g}"
        )
