"""A free loopback port for a server a test or benchmark starts."""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A free port in 20000-29999: below the kernel's ephemeral range and above Ray's worker
    ports (10002-19999), so a process started after the pick (a Ray cluster's included) cannot
    take it."""
    for _ in range(200):
        port = random.randint(20000, 29999)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29999")
