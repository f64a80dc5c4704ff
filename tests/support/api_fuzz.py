"""Schemathesis against a running edge-infer server, from the server's own /openapi.json:
every route, positive and negative cases, each call checked for no 5xx and an answer within a
time bound (shared by tests/server/test_api_fuzz.py and benchmarks/fuzz_server.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

CALL_TIMEOUT_S = 60.0


@dataclass
class FuzzReport:
    calls: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def fuzz(base_url: str, cases_per_operation: int, headers: dict[str, str] | None = None) -> FuzzReport:
    """Fuzz every operation; a 5xx or a call over CALL_TIMEOUT_S is a failure (recorded, the
    campaign goes on)."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    report = FuzzReport()
    client = httpx.Client(base_url=base_url, timeout=CALL_TIMEOUT_S, headers=headers or {})
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _campaign(op, mode, cases_per_operation, client, base_url, report)
            except Unsatisfiable:  # nothing to break in an operation without parameters
                if mode == GenerationMode.POSITIVE:
                    raise
    client.close()
    return report


def _campaign(op: Any, mode: GenerationMode, n: int, client: httpx.Client, base_url: str, report: FuzzReport) -> None:
    """n hypothesis-generated cases of one operation in one generation mode."""
    label = f"{op.label} {mode.value}"

    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def one(case: Any) -> None:
        kwargs = case.as_transport_kwargs(base_url=base_url)
        try:
            headers = dict(kwargs.get("headers") or {})
            if "json" in kwargs:  # as a JSON client sends it (the JSON routes answer 415 otherwise)
                headers.setdefault("Content-Type", "application/json")
            r = client.request(kwargs["method"], kwargs["url"], headers=headers,
                               params=kwargs.get("params"), content=_body(kwargs))
        except httpx.TimeoutException:
            report.failures.append(f"{label}: no answer within {CALL_TIMEOUT_S}s")
            return
        record(report, r, label)

    one()


def record(report: FuzzReport, r: httpx.Response, label: str) -> None:
    """Count an answer; a 5xx that is not the request's own failure is a finding."""
    report.calls += 1
    report.by_status[r.status_code] = report.by_status.get(r.status_code, 0) + 1
    if r.status_code >= 500 and not own_failure(r):
        report.failures.append(f"{label}: {r.status_code} {r.text[:300]}")


def own_failure(r: httpx.Response) -> bool:
    """A 500 that is the request's own failure inside a step (its constraints left no token):
    finish_reason "error" for it alone, not a server fault."""
    try:
        return r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
    except (ValueError, KeyError, TypeError):
        return False


def _body(kwargs: dict[str, Any]) -> bytes | None:
    if "json" in kwargs:
        import json

        return json.dumps(kwargs["json"]).encode()
    data = kwargs.get("data") or kwargs.get("content")
    return data.encode() if isinstance(data, str) else data
