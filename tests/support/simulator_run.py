"""The CUDA simulator's own pytest process (tests/kernels_cuda under NUMBA_ENABLE_CUDASIM=1, which
must be set before numba is imported, so it cannot share a test process), run in the background
and read back through files, so that any process can wait for it: under pytest-xdist the
controller starts it (tests/conftest.py) and whichever worker is handed
tests/test_cuda_simulator.py waits for it, last, while both workers run the other tests beside it.

A run's folder holds `log` (its output), `rc` (its exit status, written when it ends) and
`started` (the time it started, in seconds since the epoch)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIR_ENV = "EDGE_INFER_SIMULATOR_DIR"  # the folder of a run the xdist controller started
SIM_TESTS = "tests/test_cuda_simulator.py"
# the status is written by the shell around pytest, renamed into place so a reader never sees it half-written
_WRAPPER = '"$@" > "$SIM_DIR/log" 2>&1; echo $? > "$SIM_DIR/rc.part"; mv "$SIM_DIR/rc.part" "$SIM_DIR/rc"'
_started: list[tuple[subprocess.Popen[bytes], Path]] = []


def start() -> Path:
    """Start the simulator's pytest process (its own process group, so stop() ends pytest and
    not only the shell around it); returns the new folder it writes into."""
    folder = Path(tempfile.mkdtemp(prefix="edge-infer-sim-"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels_cuda",
           "-k", "not test_kernel_compiles_to_ptx"]
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "SIM_DIR": str(folder)}
    env.pop(DIR_ENV, None)
    (folder / "started").write_text(repr(time.time()))
    proc = subprocess.Popen(["/bin/sh", "-c", _WRAPPER, "sh", *cmd], cwd=ROOT, env=env, start_new_session=True)
    _started.append((proc, folder))
    return folder


def wait(folder: Path, timeout: float) -> tuple[int, str]:
    """(exit status, output) of the run in `folder`, waiting until `timeout` seconds after it
    started; (-1, output so far) if it has not ended by then."""
    deadline = float((folder / "started").read_text()) + timeout
    rc = folder / "rc"
    while not rc.exists() and time.time() < deadline:
        time.sleep(1.0)
    log = folder / "log"
    out = log.read_text(errors="replace") if log.exists() else ""
    return (int(rc.read_text()) if rc.exists() else -1), out


def stop() -> None:
    """End the runs this process started that are still going (a session that ends early), and
    remove their folders."""
    for proc, folder in _started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)
    _started.clear()
