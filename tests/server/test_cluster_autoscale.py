"""Autoscaling of `edge-infer serve --min-replicas 1 --max-replicas 2` on a local Ray cluster:
one replica at idle, two under load, one again after the downscale delay (its own module, so
that the two-replica cluster of test_cluster.py has stopped and the replica count is ours)."""

from __future__ import annotations

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
                       "--target-ongoing", "1", "--upscale-delay", "1", "--downscale-delay", "4",
                       "--served-model-name", "m", "--kv-cache-memory", "64MiB")
    base = len(engine_pids())
    with ThreadPoolExecutor(6) as pool:
        # 6 x 100 tokens: ~30 s of load through Ray on 2 cores, past the ~11 s the second replica
        # takes to appear (upscale delay 1 s, Serve's metrics every 10 s)
        futures = [pool.submit(chat, srv.url, f"Tell a long tale {i}.", 100, True, 300, True) for i in range(6)]
        wait_for(lambda: len(engine_pids()) >= base + 1, 120, "a second replica")
        for f in futures:
            f.result(timeout=300)
    wait_for(lambda: len(engine_pids()) == base, 120, "the scale-down")
    srv.stop()
