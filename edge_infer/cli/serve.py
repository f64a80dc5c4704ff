"""`edge-infer serve`: the OpenAI- and Anthropic-compatible HTTP server (FastAPI + uvicorn).

The server listens at once and loads the (first) model in the background (/health: 503, then
200); with several models (-m repeated, --models-dir) the others load on first use.
SIGTERM or Ctrl-C stops accepting requests, gives those in flight --shutdown-timeout seconds
to finish, aborts the rest (streams end with an error event and [DONE]) and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from edge_infer.cli.args import add_model_args, add_spec_args, engine_options, int_option, lora_options
from edge_infer.cli.common import compile_notice
from edge_infer.errors import InvalidRequest


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", parents=parents, help="serve models over OpenAI- and Anthropic-compatible HTTP APIs",
        description="Serve one or more models over HTTP: /v1/models, /v1/completions, /v1/chat/completions "
        "and /v1/responses (OpenAI), /v1/messages (Anthropic), /v1/embeddings, /v1/rerank, /tokenize, "
        "/detokenize, /lora-adapters, /health and /metrics (Prometheus). Each model's engine thread batches its requests "
        "continuously.",
    )
    add_model_args(p, many=True)
    p.add_argument("--models-dir", metavar="DIR", help="serve every .gguf in DIR as well (named by file stem)")
    p.add_argument("--lora", action="append", metavar="NAME=FILE[:SCALE]",
                   help="a LoRA adapter .gguf (llama.cpp's) over the first model, default scale SCALE (1); repeatable. "
                   "A request runs it with model: NAME (or llama.cpp's lora: [{id, scale}]); FILE alone is named by "
                   "its stem; /lora-adapters lists them")
    p.add_argument("--max-loaded-models", metavar="N", default="3",
                   help="with several models: how many stay loaded at once; a request for another unloads the "
                   "least recently used idle one, or waits while all are busy (default 3)")
    p.add_argument("--keep-alive", metavar="DURATION",
                   help="unload a model after it has been idle this long: seconds or 5m / 1h style, -1 never, 0 at "
                   "once (default: 5m with several models, never with one); a request's keep_alive field sets it "
                   "for its model")
    p.add_argument("--allow-image-urls", action="store_true",
                   help="with --mmproj: image_url parts may name http(s) URLs, fetched by the server (at most 20 MB, "
                   "10 s each; default: data: URLs only)")
    p.add_argument("--reasoning-budget", metavar="N", default="-1",
                   help="on templates that think: tokens of <think> before it is closed and the answer begins "
                   "(0: no thinking; -1: no limit, the default); a request's reasoning_effort / thinking overrides it")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", default="8000", help="port to listen on (default 8000)")
    p.add_argument("--api-key", action="append", metavar="KEY",
                   help="require `Authorization: Bearer KEY` (repeatable; also $EDGE_INFER_API_KEY); "
                   "/health and /metrics stay open")
    p.add_argument("--served-model-name", metavar="NAME", help="model id clients use (default: the model name or file stem)")
    p.add_argument("--max-num-seqs", metavar="N", help="sequences in the running batch (default 32)")
    p.add_argument("--kv-cache-memory", metavar="SIZE", help="KV cache budget, e.g. 512MiB (default: a share of free memory)")
    p.add_argument("--max-queue", metavar="N", default="256",
                   help="sequences (prompts x n) that may wait beyond the running batch; more are refused with 429 "
                   "(default 256)")
    add_spec_args(p)
    p.add_argument("--chat-template", metavar="NAME", choices=("chatml",),
                   help="built-in chat template for a model that has none (chatml); the model's own wins")
    p.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (repeatable; '*' for any); off by default")
    p.add_argument("--allowed-hosts", action="append", metavar="HOSTS",
                   help="Host header names the server answers to, comma-separated (repeatable; a port is ignored; "
                   "'*.example.com' for its subdomains, '*' for any); others get a 400, so a web page cannot read "
                   "the server through DNS rebinding. Default: the --host address, plus localhost, 127.0.0.1 and "
                   "::1 when it is a loopback address; any host when it is 0.0.0.0 or :: (the names such a server "
                   "is reached by are not known here: give them, and --api-key)")
    p.add_argument("--shutdown-timeout", metavar="S", default="5",
                   help="on SIGTERM, seconds in-flight requests get to finish before they are aborted (default 5)")
    p.add_argument("--read-timeout", metavar="S", default="30",
                   help="seconds a request body may take to arrive; then 408 (default 30)")
    p.add_argument("--write-timeout", metavar="S", default="60",
                   help="seconds a streaming client may read nothing before it is dropped (default 60)")
    ray = p.add_argument_group("scale-out on Ray Serve (the [cluster] extra; without these flags Ray is not used)")
    ray.add_argument("--replicas", metavar="N", help="engine replicas, each with --threads threads (the initial "
                     "count when autoscaling)")
    ray.add_argument("--ray-address", metavar="ADDR", help="join this Ray cluster (default: start a local one)")
    ray.add_argument("--min-replicas", metavar="A", help="autoscale on ongoing requests per replica, from A ...")
    ray.add_argument("--max-replicas", metavar="B", help="... to B replicas")
    for flag, field, metavar, default, what in AUTOSCALE_FLAGS:
        ray.add_argument(flag, dest=field, metavar=metavar, help=f"{what} (default {default:g})")
    limits = p.add_argument_group("request limits (over one: a 400 naming it; the body: 413)")
    for name, default, what in LIMIT_FLAGS:
        limits.add_argument(f"--{name.replace('_', '-')}", metavar="N", help=f"{what} (default {default})")
    p.set_defaults(func=serve)


# (RequestLimits field, default, help): `edge-infer serve --help` lists them with their defaults
# the autoscaling flags (only with --min-replicas and --max-replicas): flag, ScaleOptions field,
# metavar, default (ScaleOptions's: a test keeps them equal), help
AUTOSCALE_FLAGS = (
    ("--target-ongoing", "target_ongoing", "R", 4.0, "autoscaling target: ongoing requests per replica"),
    ("--upscale-delay", "upscale_delay_s", "S", 10.0, "seconds of load before a replica is added"),
    ("--downscale-delay", "downscale_delay_s", "S", 60.0, "seconds of low load before one is removed"),
    ("--load-window", "load_window_s", "S", 30.0, "seconds over which the autoscaler averages the load"),
)
LIMIT_FLAGS = (("max_body", 32 * 2**20, "bytes of a request body"), ("max_n", 16, "completions per request (n)"),
               ("max_stop", 16, "stop strings per request"), ("max_stop_chars", 512, "characters of a stop string"),
               ("max_logit_bias", 1024, "logit_bias entries"), ("max_messages", 2048, "chat messages per request"),
               ("max_tools", 128, "tools per request"), ("max_inputs", 2048, "prompts, embedding inputs or rerank documents per request"),
               ("max_chars", 4 * 2**20, "characters of text per request: messages, tools, prompts, inputs"))


def serve(args: argparse.Namespace) -> int:
    """Run the server until SIGTERM or Ctrl-C; returns the exit code (1 if the model failed to load)."""
    from edge_infer import hub
    from edge_infer.config import EngineConfig

    paths = _served_models(args)
    options = engine_options(args, min_model_len=2)
    if args.mmproj is not None and not os.path.isfile(args.mmproj):
        raise InvalidRequest(f"--mmproj {args.mmproj}: no such file")
    if args.allow_image_urls and args.mmproj is None:
        raise InvalidRequest("--allow-image-urls needs --mmproj (the model's multimodal projector)")
    adapters = lora_options(args.lora)
    config = EngineConfig.from_options(paths[0], **options, **({"adapters": adapters} if adapters else {}))
    port = int_option(args.port, "--port", 0)
    max_queue = int_option(args.max_queue, "--max-queue", 0)
    try:
        grace = float(args.shutdown_timeout)
    except ValueError:
        raise InvalidRequest(
            f"--shutdown-timeout must be a number of seconds, got {args.shutdown_timeout!r}"
        ) from None
    for model in paths:
        if model not in hub.KNOWN_MODELS and not hub.is_url(model):
            hub.resolve_model(model)  # a missing file fails now; known names are pulled in the background
    model = paths[0]
    name = args.served_model_name or _name(model)
    extra = _extra_models(paths[1:], {k: v for k, v in options.items() if k != "mmproj"}, {name})  # the first model's
    keep_alive = _keep_alive(args.keep_alive, several=bool(extra))
    keys = tuple(args.api_key or ()) or tuple(k for k in [os.environ.get("EDGE_INFER_API_KEY", "")] if k)

    import uvicorn

    from edge_infer.server.app import ServerSettings, create_app

    status = {"code": 0}
    server: Any = None

    def on_fatal(msg: str) -> None:
        status["code"] = 1
        if server is not None:
            server.should_exit = True

    from edge_infer.server.limits import RequestLimits

    scale = scale_options(args)

    given = {name: int_option(getattr(args, name), f"--{name.replace('_', '-')}", 1) for name, _, _ in LIMIT_FLAGS}
    limits = RequestLimits(**{k: v for k, v in given.items() if v is not None})
    settings = ServerSettings(config=config, model_name=name, aliases=(model,), api_keys=keys,
                              cors_origins=tuple(args.cors_origin or ()), max_queue=max_queue or 0,
                              chat_fallback=args.chat_template, shutdown_timeout=grace, limits=limits,
                              read_timeout=_seconds(args.read_timeout, "--read-timeout"),
                              write_timeout=_seconds(args.write_timeout, "--write-timeout"),
                              allowed_hosts=_allowed_hosts(args.allowed_hosts, args.host),
                              on_fatal=None if scale else on_fatal, extra_models=extra,
                              max_loaded_models=int_option(args.max_loaded_models, "--max-loaded-models", 1) or 1,
                              keep_alive=keep_alive, model_size=_size(model),
                              reasoning_budget=_reasoning_budget(args.reasoning_budget),
                              allow_image_urls=args.allow_image_urls)
    if scale is not None:
        if extra:
            raise InvalidRequest("--replicas serves one model: give one -m (several models behind one endpoint run "
                                 "without Ray)")
        if adapters:
            raise InvalidRequest("--lora is not served by Ray Serve replicas yet: serve the adapters without --replicas")
        from dataclasses import replace

        from edge_infer.cluster.app import serve_until_signal

        hub.resolve_model(model)  # pull a known model once, before the replicas start
        if config.n_threads is None:  # each replica gets its own cores, not all of them
            settings.config = replace(config, n_threads=scale.threads)

        return serve_until_signal(settings, scale, args.host, port or 8000)
    app = create_app(settings)
    uv = uvicorn.Config(app, host=args.host, port=port or 0, log_config=None, access_log=args.verbose >= 2,
                        timeout_graceful_shutdown=max(1, int(grace) + 5), lifespan="on")
    server = _make_server(uv, lambda: app.state.loop.call_soon_threadsafe(app.state.begin_drain))
    print(
        f"edge-infer: serving {name} at http://{args.host}:{port}/v1 (loading the model)",
        file=sys.stderr,
        flush=True,
    )
    remove = compile_notice(args)  # the model loads (and the kernels compile) inside server.run()
    try:
        server.run()
    finally:
        remove()
    return status["code"]


def _served_models(args: argparse.Namespace) -> list[str]:
    """The -m models, then the .gguf files of --models-dir (sorted), or the default model."""
    from edge_infer.hub import DEFAULT_MODEL

    models = [str(m) for m in args.model or ()]
    if args.models_dir is not None:
        folder = Path(args.models_dir)
        if not folder.is_dir():
            raise InvalidRequest(f"--models-dir {args.models_dir!r} is not a folder")
        found = sorted(str(f) for f in folder.glob("*.gguf") if f.is_file())
        if not found:
            raise InvalidRequest(f"--models-dir {args.models_dir!r} holds no .gguf file")
        models += [f for f in found if f not in models]
    return models or [DEFAULT_MODEL]


def _name(model: str) -> str:
    from edge_infer import hub

    return model if model in hub.KNOWN_MODELS else Path(model).stem


def _size(model: str) -> int:
    """Bytes of a model's file: a known model's pinned size (pulled or not), a local file's own;
    0 when unknown (a URL or hf: model not fetched yet)."""
    from edge_infer import hub

    if model in hub.KNOWN_MODELS:
        return hub.KNOWN_MODELS[model].size
    path = Path(model).expanduser()
    return path.stat().st_size if path.is_file() else 0


def _extra_models(models: list[str], options: dict[str, Any], taken: set[str]) -> tuple[Any, ...]:
    """The served models after the first, with the same engine options."""
    from edge_infer.config import EngineConfig
    from edge_infer.server.model_pool import ServedModel

    out = []
    for model in models:
        name = _name(model)
        if name in taken:
            raise InvalidRequest(f"two served models are named {name!r}: serve one of them, or rename a file")
        taken.add(name)
        out.append(ServedModel(name, EngineConfig.from_options(model, **options), (model,), _size(model)))
    return tuple(out)


def _reasoning_budget(value: str) -> int | None:
    """--reasoning-budget: a count of tokens, or None for -1 (no limit)."""
    try:
        n = int(value)
    except ValueError:
        n = -2
    if n < -1:
        raise InvalidRequest(f"--reasoning-budget must be a count of tokens, 0, or -1 (no limit), got {value!r}")
    return None if n == -1 else n


def _keep_alive(value: str | None, several: bool) -> float | None:
    """--keep-alive in seconds (None: never unload)."""
    from edge_infer.server.errors import APIError
    from edge_infer.server.model_pool import keep_alive_seconds

    if value is None:
        return 300.0 if several else None
    try:
        return keep_alive_seconds(value, "--keep-alive")
    except APIError as e:
        raise InvalidRequest(e.message) from None


def scale_options(args: argparse.Namespace) -> Any:
    """ScaleOptions from the Ray flags, or None when none is given (the plain server)."""
    given = [args.replicas, args.ray_address, args.min_replicas, args.max_replicas]
    tuning = {flag: (field, getattr(args, field)) for flag, field, *_ in AUTOSCALE_FLAGS if getattr(args, field) is not None}
    if tuning and (args.min_replicas is None or args.max_replicas is None):
        raise InvalidRequest(f"{', '.join(tuning)} tune autoscaling: give --min-replicas and --max-replicas too")
    if all(v is None for v in given):
        return None
    from edge_infer.cluster.app import ScaleOptions, ray_env

    ray_env(args.host, args.ray_address)  # before Ray is imported: its constants read the environment
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        raise InvalidRequest("--replicas and the other Ray flags need the [cluster] extra: "
                             "pip install 'edge-infer[cluster]'") from None

    def seconds(v: str, flag: str) -> float:
        try:
            return float(v)
        except ValueError:
            raise InvalidRequest(f"{flag} must be a number, got {v!r}") from None

    lo, hi = int_option(args.min_replicas, "--min-replicas", 1), int_option(args.max_replicas, "--max-replicas", 1)
    n = int_option(args.replicas, "--replicas", 1) or lo or 1
    return ScaleOptions(replicas=n, min_replicas=lo, max_replicas=hi,
                        **{field: seconds(v, flag) for flag, (field, v) in tuning.items()},
                        threads=int_option(args.threads, "-t/--threads", 1) or 1, ray_address=args.ray_address)


def _allowed_hosts(given: list[str] | None, bind_host: str) -> tuple[str, ...]:
    """--allowed-hosts as a tuple of names, or the default for the bound address."""
    from edge_infer.server.http_guards import default_allowed_hosts, entry_name

    if not given:
        return default_allowed_hosts(bind_host)
    hosts = tuple(h.strip() for v in given for h in v.split(",") if h.strip())
    bad = [h for h in hosts if h != "*" and entry_name(h.removeprefix("*.")) is None]
    if not hosts or bad:
        raise InvalidRequest(f"--allowed-hosts takes host names or addresses, got {(bad or given)[0]!r}")
    return hosts


def _seconds(value: str, flag: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise InvalidRequest(f"{flag} must be a number of seconds, got {value!r}") from None
    if not v > 0:
        raise InvalidRequest(f"{flag} must be positive, got {value!r}")
    return v


def _make_server(config: Any, on_signal: Callable[[], None]) -> Any:
    """A uvicorn.Server that starts a graceful drain on SIGINT/SIGTERM and then exits normally
    (uvicorn itself would re-raise the signal, ending the process with 128 + signal)."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

        def _on_signal(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                self.force_exit = self.force_exit or sig == signal.SIGINT  # a second Ctrl-C: stop now
                return
            self.should_exit = True
            with contextlib.suppress(Exception):  # not started yet: nothing to drain
                on_signal()

    return Server(config)
