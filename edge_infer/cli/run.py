"""`edge-infer run`: complete one prompt, streaming the text to stdout as it is generated."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.cli.args import (
    SAMPLING_HELP,
    add_model_args,
    add_sampling_args,
    add_spec_args,
    engine_options,
    read_text,
    sampling_params,
)  # fmt: skip
from edge_infer.cli.common import ChatEncoder, load_llm, print_figures, print_spec_figures, stream_request
from edge_infer.errors import InvalidRequest

if TYPE_CHECKING:
    from edge_infer.outputs import RequestOutput


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", parents=parents, help="complete a prompt, streaming the text to stdout",
        description="Complete a prompt with a model and stream the generated text (not the prompt) "
        "to stdout. The prompt is PROMPT, -p, the file of -f, or stdin (PROMPT '-' or piped input). "
        "The default model is pulled on first use. -v prints load time, prompt tokens, time to "
        "first token and decode speed on stderr (and, with --spec, the acceptance rate and tokens per "
        "step). " + SAMPLING_HELP,
    )  # fmt: skip
    p.add_argument("prompt_arg", nargs="?", metavar="PROMPT", help="the prompt text, or - to read stdin")
    p.add_argument("-p", "--prompt", help="the prompt text")
    p.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE (UTF-8)")
    add_model_args(p)
    add_sampling_args(p, default_n=128)
    add_spec_args(p)
    p.add_argument(
        "--chat", action="store_true", help="wrap the prompt as one user message in the model's chat template"
    )
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message before the prompt")
    p.add_argument("--template", metavar="NAME", help="with --chat: force a built-in template (chatml)")
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from PROMPT, -p, -f or stdin; an InvalidRequest when none or empty."""
    given = [s for s in (args.prompt_arg, args.prompt, args.file) if s is not None]
    if len(given) > 1:
        raise InvalidRequest("give the prompt once: as PROMPT, with -p, or with -f")
    if args.file is not None:
        where = args.file
        text = read_text(args.file)
    elif args.prompt is not None or (args.prompt_arg is not None and args.prompt_arg != "-"):
        where = "the prompt"
        text = args.prompt if args.prompt is not None else args.prompt_arg
    elif args.prompt_arg == "-" or not sys.stdin.isatty():
        where = "stdin"
        try:
            text = sys.stdin.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"cannot read the prompt from stdin: {e}") from None
    else:
        raise InvalidRequest("no prompt: give PROMPT, -p PROMPT or -f FILE, or pipe text on stdin")
    if not text.strip():
        raise InvalidRequest(
            f"{where} is empty: nothing to complete" if where != "the prompt" else "the prompt is empty"
        )
    return text


def run(args: argparse.Namespace) -> int:
    """Stream the completion of the prompt to stdout; returns the exit code."""
    if (args.system is not None or args.template is not None) and not args.chat:
        raise InvalidRequest("--system and --template need --chat")
    text = read_prompt(args)
    params = sampling_params(args)
    engine_options(args)  # fail on a bad -t/--seed before loading anything
    encoder = None
    model: str | Path = args.model
    if args.chat:
        from edge_infer import hub

        model = hub.resolve_model(args.model)
        encoder = ChatEncoder.for_model(model, args.template)  # no template: fail before the load
    llm = load_llm(args, model)
    try:
        prompt: str | list[int] = text
        if encoder is not None:
            messages = [{"role": "system", "content": args.system}] if args.system is not None else []
            prompt = encoder.encode(llm, [*messages, {"role": "user", "content": text}])
            params = encoder.params(params)
        final: list[RequestOutput] = []
        last = ""
        for delta in stream_request(llm, prompt, params, final):
            sys.stdout.write(delta)
            sys.stdout.flush()
            last = delta
        if not last.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if args.verbose and final:
            print_figures(final[0])
            print_spec_figures(llm)
    finally:
        llm.close()
    return 0
