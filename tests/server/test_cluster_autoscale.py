"""Autoscaling of `edge-infer serve --min-replicas 1 --max-replicas 2` on a local Ray cluster:
one replica at idle, two under load, one again after the downscale delay (its own module, so
that the two-replica cluster of test_cluster.py has stopped and the replica count is ours)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("openai")

from cluster_helpers import chat, engine_pids, wait_for  # noqa: E402

pytestmark = pytest.mark.slow


def test_autoscaling_grows_under_load_and_shrinks_back(start_server: Callable[..., Any],
                                                       smollm2_path: Path) -> None:
    srv = start_server(smollm2_path, "--min-replicas", "1", "--max-replicas", "2", "-t", "1",
                       "--target-ongoing", "1", "--upscale-delay", "1", "--downscale-delay", "4", "--load-window", "4",
                       "--served-model-name", "m", "--kv-cache-memory", "64MiB")
    base = len(engine_pids())
    stop = threading.Event()

    def load(i: int) -> None:
        # streams kept in flight until the second replica is up: the load must outlast a
        # report of the replicas' load however fast a replica decodes (6 x 100 tokens once took
        # ~30 s, and on a faster run ended before the autoscaler looked). --load-window 4: they
        # report every 2 s and the load is averaged over 4 (Serve's defaults: 10 and 30 s)
        while not stop.is_set():
            chat(srv.url, f"Tell a long tale {i}.", 100, True, 300, True)

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(load, i) for i in range(6)]
        try:
            wait_for(lambda: len(engine_pids()) >= base + 1, 120, "a second replica")
        finally:
            stop.set()
        for f in futures:
            f.result(timeout=300)
    wait_for(lambda: len(engine_pids()) == base, 120, "the scale-down")
    srv.stop()
