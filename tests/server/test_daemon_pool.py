"""The server's render threads: results and errors come back to the caller's event loop, and
a job still running when the program ends does not keep the process alive."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from edge_infer.server.daemon_pool import DaemonPool


def test_results_and_errors_reach_the_caller() -> None:
    async def main() -> None:
        pool = DaemonPool(2, "test-pool")
        assert await asyncio.gather(*(pool.run(lambda i=i: i * i) for i in range(5))) == [0, 1, 4, 9, 16]
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0)

    asyncio.run(main())


STUCK = """
import asyncio, threading
from edge_infer.server.daemon_pool import DaemonPool

async def main():
    pool = DaemonPool(2, "stuck")
    asyncio.ensure_future(pool.run(threading.Event().wait))  # blocks forever
    print(await pool.run(lambda: 40 + 2), flush=True)

asyncio.run(main())
"""


def test_a_job_still_running_does_not_hold_up_exit() -> None:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr
    assert time.monotonic() - t0 < 30
