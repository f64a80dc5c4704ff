"""Live `edge-infer serve` subprocesses on 127.0.0.1 for the server tests.

`start_server(model, *flags)` launches one on a free port, waits for /health 200 (the first
start after a kernel edit compiles the JIT cache, hence the long timeout) and stops it at the
end of the module. The statuses /health answered while waiting are kept (503 while loading).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from ports import free_port

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

STARTUP_TIMEOUT = float(os.environ.get("EDGE_INFER_TEST_SERVER_TIMEOUT", "600"))
API_KEY = "sk-test-0123456789"


@dataclass
class ServerProc:
    proc: subprocess.Popen
    url: str
    log_path: Path
    health_seen: list[int] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def launch(model: Path | str, *flags: str, log_dir: Path, wait: bool = True) -> ServerProc:
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    cmd = [sys.executable, "-m", "edge_infer.cli", "serve", "-m", str(model), "--port", str(port), *flags]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    srv = ServerProc(proc, f"http://127.0.0.1:{port}", log_path)
    if wait:
        wait_ready(srv)
    return srv


def wait_ready(srv: ServerProc) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError(f"server exited with {srv.proc.returncode}:\n{srv.log()}")
        try:
            status = httpx.get(srv.url + "/health", timeout=5).status_code
            srv.health_seen.append(status)
            if status == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    srv.stop()
    raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT} s:\n{srv.log()}")


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProc]]:
    """A factory of servers that are all stopped when the module's tests are done."""
    started: list[ServerProc] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def start(model: Path | str, *flags: str, wait: bool = True) -> ServerProc:
        srv = launch(model, *flags, log_dir=log_dir, wait=wait)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def read_metrics(url: str) -> dict[str, float]:
    from edge_infer.server.metrics import parse

    return parse(httpx.get(url + "/metrics", timeout=30).text)


@pytest.fixture(scope="session")
def get_metrics() -> Callable[[str], dict[str, float]]:
    """get_metrics(url): the server's /metrics samples as {"name{labels}": value}."""
    return read_metrics
