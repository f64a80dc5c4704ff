"""Time dequantizing every tensor of a model: edge_infer.formats.quants.dequantize side by side
with gguf-py's gguf.quants.dequantize, per tensor type.

    python benchmarks/bench_dequant.py                      # the three known models
    python benchmarks/bench_dequant.py qwen2.5-coder-0.5b --repeat 3 --check
    python benchmarks/bench_dequant.py path/to/model.gguf --json

gguf-py is fed the same mapped bytes, shaped (rows, bytes per row) as its GGUFReader hands them
out, so both sides time the dequantization alone (opening a file with GGUFReader takes seconds).
Times are the best of --repeat runs per tensor. Before timing, the file's pages and enough
output memory are touched once, so first-touch page faults land on neither side.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from gguf import quants as gq
from gguf.quants import quant_shape_to_byte_shape

from edge_infer import hub
from edge_infer.errors import EdgeInferError
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.quants import dequantize


def _best_of(fn: Any, repeat: int) -> tuple[float, np.ndarray]:
    best, out = float("inf"), None
    for _ in range(repeat):
        out = None  # free the previous result first: peak memory stays at one output
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _gguf_py_input(t: TensorInfo) -> np.ndarray:
    shape = tuple(reversed(t.shape))
    return t.data.reshape(quant_shape_to_byte_shape(shape, t.type))


def _warm_up(f: GGUFFile) -> None:
    for t in f.tensors.values():
        np.bitwise_xor.reduce(t.data[::4096])  # fault the mapping in, one byte per page
    biggest = max((t.n_elements for t in f.tensors.values()), default=0)
    np.ones(2 * biggest, np.float32)  # ours and gguf-py's outputs may coexist for a moment


def bench_model(path: Path, repeat: int, check: bool) -> dict[str, Any]:
    """-> {"types": {type: {tensors, elements, ours_s, gguf_py_s}}, "total": {...}}."""
    rows: dict[str, dict[str, float]] = defaultdict(
        lambda: dict(tensors=0, elements=0, ours_s=0.0, gguf_py_s=0.0)
    )
    with GGUFFile(path) as f:
        _warm_up(f)
        for t in f.tensors.values():
            ours_s, ours = _best_of(lambda t=t: dequantize(t), repeat)
            with np.errstate(all="ignore"):
                ref_s, ref = _best_of(lambda t=t: gq.dequantize(_gguf_py_input(t), t.type), repeat)
            if check and not np.array_equal(
                np.ascontiguousarray(ours).view(np.uint32),
                np.ascontiguousarray(ref, np.float32).view(np.uint32),
            ):
                raise SystemExit(f"{path}: tensor {t.name!r} ({t.type.name}) differs from gguf-py")
            del ours, ref
            r = rows[t.type.name]
            r["tensors"] += 1
            r["elements"] += t.n_elements
            r["ours_s"] += ours_s
            r["gguf_py_s"] += ref_s
    total = dict(tensors=0, elements=0, ours_s=0.0, gguf_py_s=0.0)
    for r in rows.values():
        for k in total:
            total[k] += r[k]
    return {"path": str(path), "types": dict(rows), "total": total}


def _fmt_row(model: str, kind: str, r: dict[str, float]) -> str:
    speedup = r["gguf_py_s"] / r["ours_s"] if r["ours_s"] > 0 else float("nan")
    rate = r["elements"] / r["ours_s"] / 1e6 if r["ours_s"] > 0 else float("nan")
    return (
        f"{model:<20} {kind:<6} {int(r['tensors']):>7} {r['elements'] / 1e6:>9.1f} "
        f"{r['ours_s']:>8.3f} {r['gguf_py_s']:>10.3f} {speedup:>8.2f} {rate:>10.0f}"
    )


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print(
        f"{'model':<20} {'type':<6} {'tensors':>7} {'M elems':>9} {'ours s':>8} {'gguf-py s':>10} "
        f"{'speedup':>8} {'ours Mel/s':>10}"
    )
    for model, res in results.items():
        for kind, r in sorted(res["types"].items(), key=lambda kv: -kv[1]["elements"]):
            print(_fmt_row(model, kind, r))
        print(_fmt_row(model, "total", res["total"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="known model names or .gguf paths (default: the known models)")
    p.add_argument("--repeat", type=int, default=1, help="runs per tensor; the best one counts (default 1)")
    p.add_argument("--check", action="store_true", help="also assert the results are bit-identical")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    names = args.models or list(hub.KNOWN_MODELS)
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            path = hub.resolve_model(name)
        except EdgeInferError as e:
            if args.models:  # asked for by name: a failure; a default model not pulled: a note
                print(f"error: {e}", file=sys.stderr)
                return 1
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        results[name] = bench_model(path, args.repeat, args.check)
    if args.json:
        print(json.dumps({"benchmark": "dequant", "repeat": args.repeat, "models": results}, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
