"""Run a piece of code in a fresh Python process and report what it raised and how much its peak
resident memory grew, so a test can assert that hostile input is refused with bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_HARNESS = """
import json, resource
{setup}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    {call}
    outcome = "ok"
except Exception as e:
    outcome = f"{{type(e).__name__}}: {{e}}"
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({{"outcome": outcome, "grown_mib": grown / 1024}}))
"""


def peak_growth(setup: str, call: str, timeout: float = 120.0) -> tuple[str, float]:
    """(outcome, MiB): `outcome` is "ok" or "<ExceptionType>: <message>" of the one-line `call`,
    run after `setup` (imports, paths); MiB is how far the peak RSS rose during `call` (Linux
    reports ru_maxrss in KiB)."""
    code = _HARNESS.format(setup=textwrap.dedent(setup), call=call)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["outcome"], result["grown_mib"]
