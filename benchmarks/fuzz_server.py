"""A long fuzz campaign of the server from its own OpenAPI schema (schemathesis; the test
suite runs a few hundred cases, this >= 5,000): no 5xx, no call left without an answer, the
server healthy afterwards. Loopback only; ends by itself.

    python benchmarks/fuzz_server.py [-m smollm2-135m] [--cases 500] [--json]

--cases is per route and generation mode (positive, negative): 500 gives ~5,000 calls (small
routes run out of distinct cases sooner).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))

from api_fuzz import fuzz  # noqa: E402
from conftest import launch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logs = Path("/tmp/edge-infer-fuzz")
    logs.mkdir(exist_ok=True)
    srv = launch(a.model, "-t", "2", "--kv-cache-memory", "32MiB", "--max-model-len", "128", "--max-n", "2",
                 log_dir=logs)
    try:
        t0 = time.monotonic()
        report = fuzz(srv.url, a.cases)
        wall = time.monotonic() - t0
        healthy = httpx.get(srv.url + "/health", timeout=30).status_code == 200
    finally:
        srv.stop()
    res = {"calls": report.calls, "by_status": report.by_status, "failures": report.failures, "wall_s": wall,
           "healthy_after": healthy}
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{report.calls} calls in {wall:.0f}s; statuses {dict(sorted(report.by_status.items()))}; "
              f"{len(report.failures)} failures; healthy afterwards: {healthy}")
        for f in report.failures[:20]:
            print("  ", f)
    return 1 if report.failures or not healthy else 0


if __name__ == "__main__":
    sys.exit(main())
