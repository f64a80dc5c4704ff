"""Server metrics in the Prometheus text exposition format (version 0.0.4), written by hand.

Server-side series (requests by endpoint and status, finish reasons, TTFT / inter-token /
end-to-end histograms, requests in flight) live here; engine-side ones (queue depth, KV
blocks, prefix-cache hit rate, token counters, speculative acceptance) come from
`LLMEngine.metrics()` at scrape time.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_infer.outputs import RequestOutput

PREFIX = "edge_infer_"
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0)

# engine.metrics() key -> (series name, type, help)
_ENGINE_SERIES = {
    "running": ("num_requests_running", "gauge", "Requests in the running batch."),
    "waiting": ("num_requests_waiting", "gauge", "Requests waiting to be scheduled."),
    "kv_blocks_used": ("kv_blocks_used", "gauge", "KV cache blocks referenced by live requests."),
    "kv_blocks_total": ("kv_blocks_total", "gauge", "KV cache blocks in the pool."),
    "kv_cache_bytes": ("kv_cache_bytes", "gauge", "Bytes of the KV pool (K and V of every attention layer)."),
    "kv_bytes_per_token": ("kv_cache_bytes_per_token", "gauge",
                           "KV pool bytes per token of context (by --kv-cache-dtype / --kv-cache-dtype-v)."),
    "kv_blocks_cached": ("kv_blocks_cached", "gauge", "Free KV blocks that still hold a reusable prefix."),
    "state_slots_used": ("state_slots_used", "gauge", "Recurrent-state slots held by live sequences (hybrid models)."),
    "state_slots_total": ("state_slots_total", "gauge", "Recurrent-state slots in the pool (hybrid models; 0 otherwise)."),
    "state_snapshots": ("state_snapshots", "gauge", "Recurrent states kept at cached prefix blocks (hybrid models)."),
    "state_cache_bytes": ("state_cache_bytes", "gauge", "Bytes of the recurrent-state pool (out of the KV budget)."),
    "kv_utilization": ("kv_slot_utilization_ratio", "gauge", "Filled share of running requests' KV slots."),
    "prefix_cache_hit_rate": ("prefix_cache_hit_rate", "gauge", "Share of prefix-cache lookups that hit."),
    "disk_hits": ("prefix_cache_disk_hits_total", "counter", "KV blocks loaded from the disk prefix cache."),
    "disk_misses": ("prefix_cache_disk_misses_total", "counter", "Disk prefix cache lookups that missed."),
    "disk_writes": ("prefix_cache_disk_writes_total", "counter", "KV blocks written to the disk prefix cache."),
    "disk_corrupt": ("prefix_cache_disk_corrupt_total", "counter", "Damaged disk prefix cache files removed."),
    "disk_dropped": ("prefix_cache_disk_dropped_total", "counter",
                     "Blocks not saved to disk because the writer was behind."),
    "preemptions": ("num_preemptions_total", "counter", "Requests preempted to free KV blocks."),
    "prompt_tokens": ("prompt_tokens_total", "counter", "Prompt tokens of admitted requests."),
    "generated_tokens": ("generation_tokens_total", "counter", "Generated tokens."),
    "steps": ("engine_steps_total", "counter", "Engine steps run."),
    "spec_proposed_tokens": ("spec_proposed_tokens_total", "counter", "Speculative tokens proposed."),
    "spec_accepted_tokens": ("spec_accepted_tokens_total", "counter", "Speculative tokens accepted."),
    "spec_acceptance_rate": ("spec_acceptance_rate", "gauge", "Accepted / proposed speculative tokens."),
    "spec_tokens_per_step": ("spec_tokens_per_step", "gauge", "Tokens emitted per speculative verify step."),
}


class Histogram:
    """A cumulative-bucket histogram."""

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = PREFIX + name, help, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for bound, n in zip(self.buckets, self.counts):
            total += n
            lines.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {total}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {_num(self.sum)}")
        lines.append(f"{self.name}_count {self.count}")
        return lines


class ServerMetrics:
    """What the HTTP side counts; `render(engine_metrics)` writes the whole exposition."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()  # (endpoint, status) -> count
        self.finished: Counter[str] = Counter()  # finish reason -> count
        self.aborted = 0
        self.rejected = 0
        self.ttft = Histogram(
            "time_to_first_token_seconds", "Time from request to its first token.", TTFT_BUCKETS
        )
        self.itl = Histogram(
            "inter_token_latency_seconds", "Time between successive tokens of a request.", ITL_BUCKETS
        )
        self.e2e = Histogram(
            "e2e_request_latency_seconds", "Time from request to its last token.", E2E_BUCKETS
        )

    def observe_finished(self, out: RequestOutput, seconds: float) -> None:
        for c in out.outputs:
            self.finished[c.finish_reason or "unknown"] += 1
        if out.metrics is not None:
            for dt in out.metrics.inter_token_latencies:
                self.itl.observe(dt)
        self.e2e.observe(seconds)

    def render(self, engine: dict[str, float] | None, *, ready: bool, in_flight: int) -> str:
        lines: list[str] = []

        def series(name: str, kind: str, help: str, samples: Sequence[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {PREFIX}{name} {help}", f"# TYPE {PREFIX}{name} {kind}"])
            lines.extend(f"{PREFIX}{name}{labels} {_num(v)}" for labels, v in samples)

        reqs = [(f'{{endpoint="{_esc(e)}",status="{s}"}}', n) for (e, s), n in sorted(self.requests.items())]
        ends = [(f'{{finish_reason="{_esc(r)}"}}', n) for r, n in sorted(self.finished.items())]
        series("ready", "gauge", "1 once the model is loaded and requests are accepted.", [("", ready)])
        series("requests_total", "counter", "HTTP requests by endpoint and status code.", reqs)
        series("request_success_total", "counter", "Finished completions by finish reason.", ends)
        series("requests_aborted_total", "counter", "Requests aborted (client gone).", [("", self.aborted)])
        series("requests_rejected_total", "counter", "Requests refused with 429.", [("", self.rejected)])
        series("num_requests_in_flight", "gauge", "Requests admitted, not finished.", [("", in_flight)])
        if engine:
            for key, (name, kind, help) in _ENGINE_SERIES.items():
                if key in engine:
                    series(name, kind, help, [("", engine[key])])
            total = engine.get("kv_blocks_total", 0.0)
            usage = engine.get("kv_blocks_used", 0.0) / total if total else 0.0
            series("kv_cache_usage_ratio", "gauge", "KV cache blocks used / total.", [("", usage)])
        for h in (self.ttft, self.itl, self.e2e):
            lines.extend(h.render())
        return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse(text: str) -> dict[str, float]:
    """Samples of an exposition as {"name{labels}": value} (for tests and the benchmark)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
