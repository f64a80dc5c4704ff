"""Seeded request workloads shared by the batching, speculative-decoding and server benchmarks.

- decode-heavy: all requests at once, short prompts (16-64 tokens), long outputs (128-256).
- mixed: prompts 16-1024 tokens, outputs 16-256, all at once.
- *-poisson: the same requests arriving as a Poisson process at `rate` requests/s (pick a rate
  above what one stream can serve, so a queue builds).
`scale` shrinks output lengths (and prompt lengths of mixed) for short default runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WORKLOADS = ("decode-heavy", "mixed", "decode-heavy-poisson", "mixed-poisson")


@dataclass(frozen=True, slots=True)
class BenchRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float  # offset from the start of the run


def make_workload(name: str, n_requests: int = 64, vocab_size: int = 32000, seed: int = 0,
                  scale: float = 1.0, rate: float = 2.0) -> list[BenchRequest]:
    """The requests of workload `name` (token ids drawn from ordinary-text ids 100..20000)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    rng = np.random.default_rng(seed)
    base = name.removesuffix("-poisson")
    if base == "decode-heavy":
        plens = rng.integers(16, 65, n_requests)
        olens = rng.integers(128, 257, n_requests)
    else:
        plens = np.maximum(16, (rng.integers(16, 1025, n_requests) * max(scale, 0.05)).astype(int))
        olens = rng.integers(16, 257, n_requests)
    olens = np.maximum(1, (olens * scale).astype(int))
    if name.endswith("-poisson"):
        arrivals = np.cumsum(rng.exponential(1.0 / rate, n_requests))
    else:
        arrivals = np.zeros(n_requests)
    hi = min(vocab_size, 20000)
    return [
        BenchRequest(f"{base}-{i}", [int(t) for t in rng.integers(100, hi, int(p))], int(o), float(a))
        for i, (p, o, a) in enumerate(zip(plens, olens, arrivals))
    ]
