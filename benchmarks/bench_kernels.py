"""Kernel micro-benchmarks: memory read bandwidth, GEMV per weight type against it, and GEMM.

    python benchmarks/bench_kernels.py                       # threads 1 and all, every type
    python benchmarks/bench_kernels.py --threads 1,2 --types Q4_0,Q8_0 --json
    python benchmarks/bench_kernels.py --quick               # smaller footprint, fewer runs

(a) Read bandwidth: a numba prange sum over a float32 array larger than twice the last-level
    cache, with each thread count: what GEMV, which reads every weight byte once, can reach.
(b) GEMV (T=1, K=4096): the path the CPU backend takes for the type (column "path": the int8
    kernel for Q4_0..Q8_0, IQ4_NL and MXFP4, the K-quant int8 kernel for Q4_K/Q5_K/Q6_K,
    IQ4_XS, the IQ1/IQ2/IQ3 grid types, TQ1_0 and TQ2_0, activation quantization included; the
    float kernel otherwise (F16, F32); --float forces the float kernel) on a ~64 MB weight
    matrix per call; the calls rotate over slices of a buffer of the same footprint as (a), so
    the weights come from memory, not L3. Reported as GB/s of the weight bytes it streams (the
    file's bytes; the repacked copy is no larger), the fraction of (a) at the same thread count,
    and GMAC/s.
(c) GEMM (T=64 and T=512, 2048 x 2048 weights): GMAC/s, the weights cache-resident.

Every figure is the median of several timed calls after a warm-up call (compilation comes from
numba's cache). Threads: numba.set_num_threads(n) and n as the kernel's n_threads argument.
The machine's load average is printed with the results: other work on the cores skews them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np

from edge_infer.formats.weight_types import weight_type
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu.backend import I8_TYPES, K_TYPES
from edge_infer.kernels_cpu.matmul import matmul_kernel
from edge_infer.kernels_cpu.matmul_i8 import matmul3_i8_kernel
from edge_infer.kernels_cpu.matmul_k import matmul3_k_kernel
from edge_infer.kernels_cpu.membw import sum_kernel
from edge_infer.kernels_cpu.repack_i8 import repack
from edge_infer.kernels_cpu.repack_k import KWeights, repack_k

TYPES = {
    "Q4_0": dq.Q4_0,
    "Q4_1": dq.Q4_1,
    "Q5_0": dq.Q5_0,
    "Q8_0": dq.Q8_0,
    "IQ4_NL": dq.IQ4_NL,
    "MXFP4": dq.MXFP4,
    "Q4_K": dq.Q4_K,
    "Q5_K": dq.Q5_K,
    "Q6_K": dq.Q6_K,
    "IQ4_XS": dq.IQ4_XS,
    "IQ3_S": dq.IQ3_S,
    "IQ3_XXS": dq.IQ3_XXS,
    "IQ2_S": dq.IQ2_S,
    "IQ2_XS": dq.IQ2_XS,
    "IQ2_XXS": dq.IQ2_XXS,
    "IQ1_S": dq.IQ1_S,
    "IQ1_M": dq.IQ1_M,
    "TQ2_0": dq.TQ2_0,
    "TQ1_0": dq.TQ1_0,
    "F16": dq.F16,
    "F32": dq.F32,
}
MB = 1 << 20


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache in sysfs (0 when unknown)."""
    best = 0
    for p in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = p.read_text().strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            best = max(best, int(text.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best


def timed(fn: Callable[[int], Any], min_runs: int, min_seconds: float) -> float:
    """Median seconds of fn(i), i = 0, 1, ...: at least min_runs calls and min_seconds in all."""
    fn(0)  # warm-up
    times: list[float] = []
    start = time.perf_counter()
    i = 1
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
        i += 1
    return statistics.median(times)


def random_weights(qtype: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row_bytes]: random blocks with finite fp16 scales."""
    if qtype == dq.F32:
        return rng.standard_normal((rows, cols), np.float32).view(np.uint8)
    if qtype == dq.F16:
        return rng.standard_normal((rows, cols), np.float32).astype(np.float16).view(np.uint8)
    t = weight_type(qtype)
    nblk = rows * cols // t.block_size
    raw = rng.integers(0, 256, (nblk, t.type_size), dtype=np.uint8)
    blocks = raw.view(t.dtype).reshape(nblk)
    for field in ("d", "dmin", "m"):  # f16 scales: random bytes there could be inf/nan
        if field in (t.dtype.names or ()):
            blocks[field] = rng.uniform(-0.05, 0.05, nblk).astype(np.float16)
    if qtype == dq.MXFP4:  # E8M0 scales near 2^-7
        blocks["e"] = rng.integers(115, 125, nblk)
    if qtype == dq.IQ1_M:  # its f16 d spread over the top nibbles of its 4 scale words (bytes 48..55)
        d16 = int(np.float16(0.01).view(np.uint16))
        for k in range(4):
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (((d16 >> (4 * k)) & 0xF) << 4)
    return raw.reshape(rows, -1)


def tiled_weights(qtype: int, cols: int, slice_bytes: int, footprint: int, rng: np.random.Generator) -> list:
    """Consecutive row slices of ~slice_bytes each covering ~footprint bytes (one random slice
    copied: the bytes' values do not change the timing)."""
    row_bytes = cols // dq.BLOCK_SHAPE[qtype][0] * dq.BLOCK_SHAPE[qtype][1]
    rows = max(64, slice_bytes // row_bytes // 64 * 64)
    n_slices = max(1, -(-footprint // (rows * row_bytes)))
    one = random_weights(qtype, rows, cols, rng)
    big = np.empty((n_slices * rows, row_bytes), np.uint8)
    for s in range(n_slices):
        big[s * rows : (s + 1) * rows] = one
    return [big[s * rows : (s + 1) * rows] for s in range(n_slices)]


def kernel_path(qtype: int, force_float: bool) -> str:
    """Which matmul the CPU backend runs a layer matrix of this type with."""
    if force_float:
        return "float"
    return "int8" if qtype in I8_TYPES["layer"] else ("int8-K" if qtype in K_TYPES else "float")


def prepared_matmul(qtype: int, w: np.ndarray, tokens: int, path: str) -> Callable[[np.ndarray, np.ndarray, int], None]:
    """fn(x [T, K], out [T, R], n_threads) computing out = x @ w.T the way `path` does,
    weights prepared once here (as the backend's prepare_weights), activations per call."""
    rows, k = w.shape[0], w.shape[1] // dq.BLOCK_SHAPE[qtype][1] * dq.BLOCK_SHAPE[qtype][0]
    no_out = np.empty((tokens, 0), np.float32)
    if path == "int8-K":
        kw = repack_k(w, qtype, rows, k)
        bufs = (np.empty((tokens, k // 4), np.int32), np.empty((tokens, k // 32), np.float32),
                np.empty((tokens, k // 16), np.int32))
        none = KWeights(np.empty((0, 1, 1), np.uint8), dq.Q4_K).args
        return lambda x, out, n: matmul3_k_kernel(x, *bufs, *kw.args, out, *none, no_out, *none, no_out, n)
    if path == "int8":
        iw = repack(w, qtype, rows, k)
        bufs = (np.empty((tokens, k // 4), np.int32), np.empty((tokens, k // 32), np.float32),
                np.empty((tokens, k // 32), np.int32))
        assert iw is not None  # scales a random MXFP4 matrix keeps within f16
        none8 = (np.empty((0, 1, 256), np.uint8), np.empty((0, 1, 16), np.uint16), np.empty((0, 0, 0), np.uint16), 0,
                 4)
        return lambda x, out, n: matmul3_i8_kernel(x, *bufs, *iw.args, out, *none8, no_out, *none8, no_out, n)
    return lambda x, out, n: matmul_kernel(x, w, qtype, out, n)


def bench_bandwidth(footprint: int, threads: list[int], min_runs: int, min_s: float) -> dict[int, float]:
    a = np.full(footprint // 4, 1.0, np.float32)
    res = {}
    for n in threads:
        numba.set_num_threads(n)
        sec = timed(lambda _i, n=n: sum_kernel(a, n), min_runs, min_s)
        res[n] = a.nbytes / sec / 1e9
    return res


def bench_gemv(
    qtype: int,
    threads: list[int],
    footprint: int,
    slice_bytes: int,
    min_runs: int,
    min_s: float,
    rng: np.random.Generator,
    path: str,
) -> dict[int, dict[str, float]]:
    K = 4096
    slices = tiled_weights(qtype, K, slice_bytes, footprint, rng)
    R = slices[0].shape[0]
    x = rng.standard_normal((1, K), np.float32)
    out = np.empty((1, R), np.float32)
    fns = [prepared_matmul(qtype, w, 1, path) for w in slices]  # the repacked copies replace the slices
    res = {}
    for n in threads:
        numba.set_num_threads(n)
        runs = max(min_runs, len(slices))
        sec = timed(lambda i, n=n: fns[i % len(fns)](x, out, n), runs, min_s)
        res[n] = {
            "gbps": slices[0].nbytes / sec / 1e9,
            "gmacs": R * K / sec / 1e9,
            "ms": sec * 1e3,
            "rows": R,
            "cols": K,
            "weight_mb": slices[0].nbytes / MB,
        }
    return res


def bench_gemm(
    qtype: int, threads: list[int], tokens: int, min_runs: int, min_s: float, rng: np.random.Generator, path: str
) -> dict[int, float]:
    R = K = 2048
    fn = prepared_matmul(qtype, random_weights(qtype, R, K, rng), tokens, path)
    x = rng.standard_normal((tokens, K), np.float32)
    out = np.empty((tokens, R), np.float32)
    res = {}
    for n in threads:
        numba.set_num_threads(n)
        sec = timed(lambda _i, n=n: fn(x, out, n), min_runs, min_s)
        res[n] = tokens * R * K / sec / 1e9
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--threads",
        default=f"1,{numba.config.NUMBA_NUM_THREADS}",
        help="comma-separated thread counts (default: 1 and all of numba's)",
    )
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated weight types")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    ap.add_argument("--quick", action="store_true", help="smaller footprint and fewer runs")
    ap.add_argument("--float", action="store_true", help="time the float kernel for every type")
    args = ap.parse_args(argv)
    threads = sorted({int(t) for t in args.threads.split(",") if t.strip()})
    if not threads or threads[0] < 1 or threads[-1] > numba.config.NUMBA_NUM_THREADS:
        ap.error(
            f"--threads {args.threads!r}: each must be 1..{numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS)"
        )
    names = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in names if t not in TYPES]
    if unknown:
        ap.error(f"--types: unknown {', '.join(unknown)} (known: {', '.join(TYPES)})")

    llc = last_level_cache_bytes()
    if args.quick:
        footprint, slice_bytes, min_runs, min_s = 128 * MB, 32 * MB, 3, 0.1
    else:
        footprint, slice_bytes, min_runs, min_s = max(400 * MB, 2 * llc), 64 * MB, 7, 0.3
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    bw = bench_bandwidth(footprint, threads, min_runs, min_s)
    rows = []
    for name in names:
        q = TYPES[name]
        path = kernel_path(q, args.float)
        gemv = bench_gemv(q, threads, footprint, slice_bytes, min_runs, min_s, rng, path)
        g64 = bench_gemm(q, threads, 64, min_runs, min_s, rng, path)
        g512 = bench_gemm(q, threads, 512, max(3, min_runs // 2), min_s, rng, path)
        for n in threads:
            rows.append(
                {
                    "type": name,
                    "path": path,
                    "threads": n,
                    "gemv_gbps": gemv[n]["gbps"],
                    "gemv_frac_bw": gemv[n]["gbps"] / bw[n],
                    "gemv_gmacs": gemv[n]["gmacs"],
                    "gemv_ms": gemv[n]["ms"],
                    "gemv_shape": [gemv[n]["rows"], gemv[n]["cols"]],
                    "gemv_weight_mb": gemv[n]["weight_mb"],
                    "gemm64_gmacs": g64[n],
                    "gemm512_gmacs": g512[n],
                }
            )
    result = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "numba_threads": numba.config.NUMBA_NUM_THREADS,
            "last_level_cache_mb": llc / MB,
            "footprint_mb": footprint / MB,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "seconds": time.perf_counter() - t_start,
            "quick": args.quick,
        },
        "bandwidth_gbps": {str(n): v for n, v in bw.items()},
        "kernels": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    m = result["machine"]
    print(
        f"read bandwidth over {m['footprint_mb']:.0f} MB (LLC {m['last_level_cache_mb']:.0f} MB): "
        + ", ".join(f"{n} thread{'s' if n > 1 else ''} {v:.1f} GB/s" for n, v in bw.items())
    )
    hdr = f"{'type':<6} {'path':<6} {'thr':>3} {'GEMV GB/s':>9} {'of BW':>6} {'GMAC/s':>7} {'ms':>7}  {'T=64 GMAC/s':>11} {'T=512 GMAC/s':>12}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['type']:<6} {r['path']:<6} {r['threads']:>3} {r['gemv_gbps']:>9.2f} {r['gemv_frac_bw']:>6.0%} "
            f"{r['gemv_gmacs']:>7.2f} {r['gemv_ms']:>7.2f}  {r['gemm64_gmacs']:>11.2f} {r['gemm512_gmacs']:>12.2f}"
        )
    print(
        f"GEMV: K=4096, ~{slice_bytes // MB} MB of weights per call; GEMM: 2048 x 2048. "
        f"load average {m['loadavg_before'][0]:.2f} -> {m['loadavg_after'][0]:.2f}; {m['seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
