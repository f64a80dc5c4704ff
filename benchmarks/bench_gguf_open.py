"""Open-time of GGUF files: edge-infer's GGUFFile side by side with gguf-py's GGUFReader.

    python benchmarks/bench_gguf_open.py [--models smollm2-135m,...] [--repeat 3] [--json]

Each figure is the median wall time of opening the file and reading all metadata and tensor
infos (the page cache is warm after the first run of either reader).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from edge_infer.formats.gguf import GGUFFile
from edge_infer.hub import KNOWN_MODELS, resolve_model


def time_open(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(KNOWN_MODELS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from gguf import GGUFReader

    rows = []
    for name in args.models.split(","):
        path = resolve_model(name)

        def ours(path=path) -> None:  # type: ignore[no-untyped-def]
            with GGUFFile(path) as f:
                assert f.tensors

        def theirs(path=path) -> None:  # type: ignore[no-untyped-def]
            r = GGUFReader(str(path))
            assert r.tensors

        ours()  # warm the page cache for both
        t_ours = time_open(ours, args.repeat)
        t_ref = time_open(theirs, max(1, args.repeat // 2 + 1))
        rows.append({"model": name, "edge_s": t_ours, "gguf_py_s": t_ref, "speedup": t_ref / t_ours})
    if args.json:
        print(json.dumps({"benchmark": "gguf_open", "rows": rows}, indent=2))
        return
    print(f"{'model':<22}{'edge-infer':>12}{'gguf-py':>12}{'speed-up':>10}")
    for r in rows:
        print(f"{r['model']:<22}{r['edge_s'] * 1000:>10.0f}ms{r['gguf_py_s'] * 1000:>10.0f}ms{r['speedup']:>9.0f}x")


if __name__ == "__main__":
    main()
