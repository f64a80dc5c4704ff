"""Decode attention alone: one query token over its sequence's cached keys, through the CPU
backend's paged attention (kernels_cpu/attention_tiles.py), per layer call, for a model's head
shape, several context lengths and KV types. An f16 / f32 pool's blocks are read in place by the
score and value lanes, and so are q8_0 / q4_0 blocks (codes widened in registers); the other
llama.cpp block types are decoded chunk by chunk first.

    python benchmarks/bench_attention.py [--shape smollm2|qwen0.5b|qwen1.5b] [--contexts 512,2048,8192]
        [--kv-types f16,q8_0,q4_0,iq4_nl] [--threads 1,2] [--calls 2000] [--json]

Each figure is the best of 5 timings of --calls back-to-back calls (after 50 warm-up calls), in
microseconds per call: the pool of one layer stays in the CPU's caches, as a decode step's
layers do not, so these are the kernel's own costs.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from edge_infer.kernels_cpu.attention import store_kv_kernel
from edge_infer.kernels_cpu.backend import CpuBackend

SHAPES = {"smollm2": (9, 3, 64), "qwen0.5b": (14, 2, 64), "qwen1.5b": (12, 2, 128)}  # heads, kv heads, head dim
BLOCK = 16  # the engine's default block size


def time_call(n_threads: int, heads: int, kv: int, hd: int, ctx: int, kv_type: str, calls: int) -> float:
    """Microseconds per decode attention call (best of 5)."""
    b = CpuBackend(n_threads)
    n_blocks = -(-ctx // BLOCK)
    (layer,) = b.make_kv_pool(1, n_blocks + 1, BLOCK, kv, hd, kv_type)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((ctx, kv * hd)).astype(np.float32)
    v = rng.standard_normal((ctx, kv * hd)).astype(np.float32)
    tables = np.arange(n_blocks, dtype=np.int32)[::-1].reshape(1, n_blocks).copy()  # blocks in reverse
    pos = np.arange(ctx)
    slots = tables[0, pos // BLOCK].astype(np.int64) * BLOCK + pos % BLOCK
    store_kv_kernel(k, v, slots, *layer)  # llama.cpp's block types quantized (and rotated) as the engine stores them
    q = rng.standard_normal((1, heads * hd)).astype(np.float32)
    out = np.empty_like(q)
    args = (q, layer, tables, np.zeros(1, np.int32), np.full(1, ctx - 1, np.int32), np.float32(hd**-0.5), 0,
            np.float32(0.0), out)
    for _ in range(50):
        b.attention(*args)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            b.attention(*args)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    p.add_argument("--contexts", default="512,2048,8192")
    p.add_argument("--kv-types", default="f16,q8_0,q4_0,iq4_nl")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    heads, kv, hd = SHAPES[a.shape]
    threads = [int(t) for t in a.threads.split(",")]
    rows = [{"kv_type": t, "context": c, "us": {n: time_call(n, heads, kv, hd, c, t, a.calls) for n in threads}}
            for t in a.kv_types.split(",") for c in (int(x) for x in a.contexts.split(","))]
    if a.json:
        print(json.dumps({"shape": a.shape, "heads": heads, "kv_heads": kv, "head_dim": hd, "rows": rows}, indent=2))
        return 0
    print(f"decode attention, {a.shape} shape ({heads} heads, {kv} KV heads, head dim {hd}), blocks of {BLOCK}; "
          f"us per call, best of 5 x {a.calls}")
    print(f"{'KV type':8}{'context':>9}" + "".join(f"{f'{n} thread(s)':>14}" for n in threads))
    for r in rows:
        print(f"{r['kv_type']:8}{r['context']:>9}" + "".join(f"{r['us'][n]:>14.1f}" for n in threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
