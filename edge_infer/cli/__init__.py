"""The `edge-infer` command line.

Each subcommand is one module here with a `register(sub, parents)` function that adds its
parser and sets `func` (args -> exit code); add a new one to `_COMMANDS`. The options several
commands share are in args.py, what run, chat and perplexity do alike in common.py. Heavy
imports happen inside the command functions, so `edge-infer models` does not pay for numpy or
numba.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from edge_infer._version import __version__
from edge_infer.cli import bench, chat, convert, doctor, inspect, models, perplexity, quantize, run, serve
from edge_infer.errors import EdgeInferError

Register = Callable[[Any, list[argparse.ArgumentParser]], None]

_COMMANDS: tuple[Register, ...] = (
    models.register_pull, models.register_models, inspect.register,
    run.register, chat.register, perplexity.register, bench.register,
    serve.register, doctor.register, quantize.register, convert.register,
)


def build_parser() -> argparse.ArgumentParser:
    """The `edge-infer` parser with every subcommand."""
    # -v is accepted before or after the subcommand. The two places count into different
    # names (a subparser's namespace overwrites the parent's values on some Python versions);
    # main() adds them up.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    verbose.add_argument("-q", "--quiet", action="store_true", help="no notes on stderr (errors still)")
    parser = argparse.ArgumentParser(prog="edge-infer", description="CPU-first LLM inference for GGUF models.")
    parser.add_argument("-v", "--verbose", dest="verbose_before", action="count", default=0,
                        help="log more (-vv: debug)")
    parser.add_argument("-q", "--quiet", dest="quiet_before", action="store_true",
                        help="no notes on stderr, such as the one while kernels compile (errors still)")
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
    args.quiet = getattr(args, "quiet", False) or getattr(args, "quiet_before", False)
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
