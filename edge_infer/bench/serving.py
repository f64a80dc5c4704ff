"""Drive an LLMEngine through a workload on the calling thread and measure throughput and
latency (used by `edge-infer bench --workload` and benchmarks/bench_batching.py)."""

from __future__ import annotations

import time

import numpy as np

from edge_infer.bench.workloads import BenchRequest
from edge_infer.engine.engine import LLMEngine
from edge_infer.sampling_params import SamplingParams


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def run_engine(engine: LLMEngine, reqs: list[BenchRequest], concurrency: int, static: bool,
               padded: bool = False) -> dict:
    """Keep `concurrency` requests in flight, greedy with ignore_eos, so every run generates the
    same tokens. Returns output tokens/s and TTFT / inter-token latency percentiles (seconds).

    static: batches of `concurrency` requests; the next batch starts when the whole batch has
    ended. padded (with static): classic static batching, as a fixed-shape [batch, length]
    generate loop runs it: a row that has finished keeps its slot and is computed (padding)
    until the batch's longest request ends; only each request's own tokens are counted.
    Without padded, finished rows leave the batch (our engine's behaviour, minus refilling)."""
    pending = list(reqs)
    t0 = time.monotonic()
    in_flight: set[str] = set()
    ttft: list[float] = []
    itl: list[float] = []
    out_tokens = 0
    wanted: dict[str, int] = {}
    while pending or in_flight:
        now = time.monotonic()
        can_add = not static or not in_flight
        batch: list[BenchRequest] = []
        while can_add and pending and len(batch) < concurrency - len(in_flight) and pending[0].arrival_s <= now - t0:
            batch.append(pending.pop(0))
        longest = max((r.max_tokens for r in batch), default=0)
        for r in batch:
            wanted[r.request_id] = r.max_tokens
            engine.add_request(r.request_id, r.prompt_token_ids,
                               SamplingParams(max_tokens=longest if static and padded else r.max_tokens,
                                              temperature=0.0, ignore_eos=True))
            in_flight.add(r.request_id)
        if not in_flight:
            time.sleep(max(0.0, pending[0].arrival_s - (time.monotonic() - t0)))
            continue
        for out in engine.step():
            if out.finished:
                in_flight.discard(out.request_id)
                m = out.metrics
                own = min(len(out.token_ids), wanted[out.request_id])
                out_tokens += own
                if m is not None and m.first_token_time is not None:
                    ttft.append(m.first_token_time - m.arrival_time)
                    itl += m.inter_token_latencies[: own - 1]
    wall = time.monotonic() - t0
    return {"output_tokens": out_tokens, "wall_s": wall, "tokens_per_s": out_tokens / wall,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99),
            "preemptions": engine.scheduler.num_preemptions}


