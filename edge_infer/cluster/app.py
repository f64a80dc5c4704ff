"""Building and running the two-tier Ray Serve application of `edge-infer serve --replicas`."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_infer.errors import EdgeInferError, InvalidRequest
from edge_infer.server.app import ServerSettings
from edge_infer.server.http_guards import is_loopback

log = logging.getLogger("edge_infer.cluster")
APP_NAME = "edge-infer"
ENGINE = "engine"
ROUTER = "edge_infer.cluster.router:PrefixAffinityRouter"


@dataclass(frozen=True, slots=True)
class ScaleOptions:
    """replicas: a fixed count, or the initial one with autoscaling between min_replicas and
    max_replicas on ongoing requests per replica (target_ongoing) averaged over the last
    load_window_s seconds; upscale/downscale delays in seconds (Serve's default downscale delay
    is 600 s). threads: CPUs reserved per replica."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing: float = 4.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 60.0
    load_window_s: float = 30.0
    threads: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.threads < 1:
            raise InvalidRequest("--replicas and --threads must be at least 1")
        lo, hi = self.min_replicas, self.max_replicas
        if (lo is None) != (hi is None):
            raise InvalidRequest("give --min-replicas and --max-replicas together (autoscaling bounds)")
        if lo is not None and hi is not None and not 0 < lo <= self.replicas <= hi:
            raise InvalidRequest(f"need 1 <= --min-replicas ({lo}) <= --replicas ({self.replicas}) "
                                 f"<= --max-replicas ({hi})")
        if self.target_ongoing <= 0 or self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise InvalidRequest("--target-ongoing must be positive and the delays non-negative")
        if not self.load_window_s > 0:
            raise InvalidRequest(f"--load-window must be positive, got {self.load_window_s}")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None


class _Ingress:
    """The ingress deployment: the plain server's app over a ClusterEngine."""

    def __init__(self, engine_handle: Any, settings: ServerSettings, max_queue: int) -> None:
        from edge_infer.cluster.replica import log_to_serve

        log_to_serve()
        self.handle, self.settings, self.max_queue = engine_handle, settings, max_queue

    def __serve_build_asgi_app__(self) -> Any:
        from edge_infer.cluster.client import ClusterEngine
        from edge_infer.server.app import create_app

        s = self.settings
        engine = ClusterEngine(s.config, self.handle, max_queue=self.max_queue, chat_fallback=s.chat_fallback)
        return create_app(s, engine=engine)


def build_app(settings: ServerSettings, scale: ScaleOptions) -> Any:
    """The Serve application: ingress (no CPU reserved) -> engine replicas (`threads` CPUs)."""
    from ray import serve
    from ray.serve.config import AutoscalingConfig, RequestRouterConfig

    from edge_infer.cluster.replica import EngineReplica

    config = settings.config
    per_replica = config.max_num_seqs + settings.max_queue
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    opts: dict[str, Any] = {
        "name": ENGINE, "logging_config": quiet, "ray_actor_options": {"num_cpus": scale.threads},
        "max_ongoing_requests": per_replica, "health_check_period_s": 2.0, "health_check_timeout_s": 30.0,
        "graceful_shutdown_timeout_s": settings.shutdown_timeout,
        "request_router_config": RequestRouterConfig(request_router_class=ROUTER),  # type: ignore[arg-type]
    }
    if scale.autoscaling:
        assert scale.min_replicas is not None and scale.max_replicas is not None  # __post_init__
        opts["autoscaling_config"] = AutoscalingConfig(
            min_replicas=scale.min_replicas, max_replicas=scale.max_replicas, initial_replicas=scale.replicas,
            target_ongoing_requests=scale.target_ongoing, upscale_delay_s=scale.upscale_delay_s,
            downscale_delay_s=scale.downscale_delay_s, look_back_period_s=scale.load_window_s,
            # replicas report their load at least twice per window (Serve's default: every 10 s)
            metrics_interval_s=min(10.0, scale.load_window_s / 2))
    else:
        opts["num_replicas"] = scale.replicas
    engine = serve.deployment(**opts)(EngineReplica).bind(config, settings.max_queue)
    most = scale.max_replicas or scale.replicas
    deploy_ingress = serve.deployment(name="ingress", ray_actor_options={"num_cpus": 0},
                                      max_ongoing_requests=per_replica * most, logging_config=quiet)
    ingress = deploy_ingress(serve.ingress()(_Ingress))
    return ingress.bind(engine, settings, settings.max_queue + config.max_num_seqs * (most - 1))


def ray_env(host: str, ray_address: str | None) -> None:
    """The environment of a local Ray cluster, set before Ray is first imported (its constants
    read it then). For a loopback --host: Ray's single-machine mode, whose node address is
    127.0.0.1, so its GCS, raylet, workers, agents and Prometheus exporters listen on loopback
    only (otherwise Ray swaps a loopback node address for the machine's network address and
    binds every interface)."""
    if ray_address is None and is_loopback(host):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def private_token(create: bool) -> Path | None:
    """Ray's cluster token file (RAY_AUTH_TOKEN_PATH, default ~/.ray/auth_token) readable by its
    owner only: Ray writes it with the umask's mode (0644), so any local user could read it and
    run code on the cluster. create: write a new token, mode 0600, when there is none (a local
    cluster; Ray then uses it); an existing one of ours is chmod-ed to 0600."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return None  # no file (the token is in the environment), or no token auth
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        if create:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_hex(32))  # what Ray's own generator writes: 256 random bits
                return path
        if path.exists() and path.stat().st_uid == os.getuid():
            path.chmod(0o600)
    except OSError as e:
        log.warning("cannot make the Ray token file %s private: %s", path, e)
    return path


def start(settings: ServerSettings, scale: ScaleOptions, host: str, port: int) -> None:
    """Connect to (or start) Ray, deploy the application at http://host:port; returns when it
    is running (replicas loaded). A local cluster stays on the serve host where Ray allows it
    (docs/scale-out.md: what a multi-host cluster must firewall)."""
    ray_env(host, scale.ray_address)
    import ray
    from ray import serve

    quiet = {"log_level": "WARNING", "enable_access_log": False}
    if scale.ray_address:
        private_token(create=False)
        ray.init(address=scale.ray_address, logging_level=logging.WARNING)
    else:
        # Serve's proxy otherwise drains for at least 30 s on shutdown (meant for load balancers
        # in front of a long-lived cluster); the replicas still get --shutdown-timeout to finish.
        os.environ.setdefault("RAY_SERVE_PROXY_MIN_DRAINING_PERIOD_S", "1")
        # Serve's throughput profile: user code on each replica's own event loop (no thread hop
        # per streamed message) and gRPC between deployments; clients still enter at the proxy.
        os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
        os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0")
        private_token(create=True)
        ray.init(include_dashboard=False, logging_level=logging.WARNING, **_node_address(host))
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config=quiet)
    except TimeoutError as e:  # Serve waits a fixed 60 s for its proxy, which a busy CPU can outlast
        raise EdgeInferError(f"Ray Serve's HTTP proxy did not start ({e}): Ray's processes got too little CPU "
                             "time; retry when the machine is less loaded, or serve without the Ray flags") from None
    serve.run(build_app(settings, scale), name=APP_NAME, route_prefix="/", blocking=False)


def _node_address(host: str) -> dict[str, Any]:
    """ray.init's node address for a --host that is one of this machine's network addresses (Ray
    advertises it and binds its agents' HTTP to it); loopback comes from ray_env, a wildcard or a
    name from Ray's own choice."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return {}
    return {} if ip.is_loopback or ip.is_unspecified else {"_node_ip_address": str(ip)}


def stop() -> None:
    """Delete the application and leave Ray (a cluster started here is stopped)."""
    import ray
    from ray import serve

    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def serve_until_signal(settings: ServerSettings, scale: ScaleOptions, host: str, port: int) -> int:
    """start(), then wait for SIGINT/SIGTERM, then stop(); the exit code."""
    stopping: list[int] = []  # set by the handler (no locks in a signal handler: it may interrupt one)
    old: dict[int, Any] = {}
    try:
        start(settings, scale, host, port)
        # after ray.init, which installs handlers of its own
        old = {s: signal.signal(s, lambda n, _f: stopping.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
        print(f"edge-infer: serving {settings.model_name} on Ray Serve at http://{host}:{port}/v1 "
              f"({scale.replicas} engine replica(s))", flush=True)
        while not stopping:
            time.sleep(0.5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stop()
    return 0
