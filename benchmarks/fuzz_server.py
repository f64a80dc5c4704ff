"""A long fuzz campaign of the server from its own OpenAPI schema (schemathesis; the test
suite runs a few hundred cases, this >= 5,000): no 5xx, no call left without an answer, the
server healthy afterwards; then the hostile-request campaign (tests/support/attack_fuzz.py:
grammars with min_tokens, huge regexes, stop-id floods, control tokens in every string field)
beside a victim stream whose text must equal its solo run. Loopback only; ends by itself.

    python benchmarks/fuzz_server.py [-m smollm2-135m] [--cases 500] [--attacks 5000] [--json]

--cases is per route and generation mode (positive, negative): 500 gives ~5,000 calls (small
routes run out of distinct cases sooner); 0 skips schemathesis. --attacks: hostile requests (0
skips them). A 500 with code generation_failed is a request's own failure, not a finding.
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

from api_fuzz import FuzzReport, fuzz  # noqa: E402
from attack_fuzz import AttackReport, attack  # noqa: E402
from conftest import launch  # noqa: E402

from edge_infer.hub import resolve_model  # noqa: E402
from edge_infer.tokenizer import Tokenizer  # noqa: E402
from edge_infer.tokenizer.vocab import Attr  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--attacks", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logs = Path("/tmp/edge-infer-fuzz")
    logs.mkdir(exist_ok=True)
    srv = launch(a.model, "-t", "2", "--kv-cache-memory", "32MiB", "--max-model-len", "128", "--max-n", "2",
                 log_dir=logs)
    tok = Tokenizer.from_gguf(resolve_model(a.model))
    control = {i for i in range(tok.vocab_size) if tok.token_attr(i) & Attr.CONTROL}
    try:
        t0 = time.monotonic()
        report = fuzz(srv.url, a.cases) if a.cases else FuzzReport()
        wall = time.monotonic() - t0
        t0 = time.monotonic()
        hostile = attack(srv.url, a.attacks, tok.vocab_size, control) if a.attacks else AttackReport()
        attack_wall = time.monotonic() - t0
        healthy = httpx.get(srv.url + "/health", timeout=30).status_code == 200
    finally:
        srv.stop()
    res = {"calls": report.calls, "by_status": report.by_status, "failures": report.failures, "wall_s": wall,
           "attacks": hostile.calls, "attack_by_status": hostile.by_status, "attack_failures": hostile.failures,
           "victim_runs": hostile.victim_runs, "victim_failures": hostile.victim_failures,
           "attack_wall_s": attack_wall, "healthy_after": healthy}
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"schemathesis: {report.calls} calls in {wall:.0f}s; statuses {dict(sorted(report.by_status.items()))}; "
              f"{len(report.failures)} failures")
        print(f"attacks: {hostile.calls} calls in {attack_wall:.0f}s; statuses {dict(sorted(hostile.by_status.items()))}; "
              f"{len(hostile.failures)} failures; victim: {hostile.victim_runs} runs, "
              f"{len(hostile.victim_failures)} failures; healthy afterwards: {healthy}")
        for f in (report.failures + hostile.failures + hostile.victim_failures)[:20]:
            print("  ", f)
    bad = report.failures or hostile.failures or hostile.victim_failures
    return 1 if bad or not healthy else 0


if __name__ == "__main__":
    sys.exit(main())
