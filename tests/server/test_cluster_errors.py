"""What a client of `serve --replicas` is told when a replica fails, without Ray (issue #33): a
dead replica's error (whose text names its pid, node address and actor id) becomes a generic
503 and is logged in full; the request's own errors pass as the plain server sends them."""

from __future__ import annotations

import logging
import re

import pytest

pytest.importorskip("fastapi")

from edge_infer.cluster.client import _replica_error  # noqa: E402
from edge_infer.errors import EdgeInferError, GenerationError, InvalidRequest  # noqa: E402
from edge_infer.server.errors import APIError  # noqa: E402

RAY_TEXT = ("The actor died unexpectedly before finishing this task. class_name: ServeReplica:edge-infer:engine "
            "actor_id: 08d302eeb615d7021b987ba201000000 pid: 16120 name: SERVE_REPLICA::edge-infer#engine#0703y2n0 "
            "namespace: serve ip: 10.20.30.40")


class ActorDiedError(Exception):
    """Ray's exception as far as the ingress sees it: a type name and a message."""


class RayTaskError(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"ray::ServeReplica.generate() (pid=16120, ip=10.20.30.40) {cause}")
        self.cause = cause


def test_a_dead_replica_is_a_generic_503_logged_in_full(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="edge_infer.cluster"):
        err = _replica_error(ActorDiedError(RAY_TEXT), "request chatcmpl-1")
    assert isinstance(err, APIError) and err.status == 503 and err.code == "replica_failed"
    assert err.headers.get("Retry-After") == "1"
    said = str(err.body())
    assert not re.search(r"16120|08d302|10\.20\.30\.40|pid|actor|ip:", said), said
    assert "16120" in caplog.text and "10.20.30.40" in caplog.text and "chatcmpl-1" in caplog.text


@pytest.mark.parametrize("cause", [EdgeInferError("the engine failed a step (pid 16120)"), RuntimeError(RAY_TEXT),
                                   APIError(500, f"internal: {RAY_TEXT}")])
def test_engine_faults_inside_a_replica_are_generic(cause: BaseException) -> None:
    err = _replica_error(RayTaskError(cause), "request x")
    assert isinstance(err, APIError) and err.status == 503 and "16120" not in str(err.body())


@pytest.mark.parametrize("cause", [InvalidRequest("max_tokens must be at least 1, got 0"),
                                   GenerationError("the grammar left no token to sample"),
                                   APIError(429, "the server is at capacity", code="queue_full")])
def test_the_requests_own_errors_pass_through(cause: BaseException) -> None:
    assert _replica_error(RayTaskError(cause), "request x") is cause


def test_a_proxy_that_never_starts_is_an_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve gives its HTTP proxy a fixed 60 s and raises a bare TimeoutError; on a loaded
    machine `serve --replicas` printed it as a traceback."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")
    from edge_infer.cluster import app

    for name, value in (("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "1"), ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1"),
                        ("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0"), ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")):
        monkeypatch.setenv(name, value)  # what start() sets: undone after the test
    monkeypatch.setattr(ray, "init", lambda **_: None)
    monkeypatch.setattr(app, "private_token", lambda create: None)

    def late(**_: object) -> None:
        raise TimeoutError("HTTP proxies not available after 60s.")

    monkeypatch.setattr(serve, "start", late)
    with pytest.raises(EdgeInferError, match="HTTP proxy did not start .*60s.*less loaded"):
        app.start(None, app.ScaleOptions(), "127.0.0.1", 8000)  # type: ignore[arg-type]  # not reached
