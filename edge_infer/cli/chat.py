"""`edge-infer chat`: an interactive multi-turn conversation with the model's chat template.

Each turn renders the whole history with the template (the engine's prefix cache makes the
earlier turns cheap). Ctrl-C during a reply stops it and drops that turn (the user message and
the partial reply) from the history; Ctrl-C at the prompt only prints a hint. Ctrl-D, /exit
or /quit leave; /reset clears the history (keeping --system); /help lists the commands.
A turn that fails (too long for the context, say) is reported in one line and dropped.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from edge_infer.cli.args import (
    SAMPLING_HELP,
    add_lora_arg,
    add_model_args,
    add_sampling_args,
    add_spec_args,
    engine_options,
    lora_options,
    sampling_params,
)
from edge_infer.cli.common import ChatEncoder, Message, load_llm, print_figures, stream_request
from edge_infer.errors import EdgeInferError

if TYPE_CHECKING:
    from edge_infer.llm import LLM
    from edge_infer.outputs import RequestOutput
    from edge_infer.sampling_params import SamplingParams

HELP = "commands: /reset clears the history, /exit or Ctrl-D quits, Ctrl-C stops a reply, /help shows this"


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chat", parents=parents, help="chat with a model interactively",
        description="An interactive multi-turn chat using the model's chat template. The history is "
        "kept across turns. Ctrl-C stops the current reply and drops that turn (your message and the "
        "partial reply) from the history; /reset clears the history; /exit, /quit or Ctrl-D quits. "
        "Lines are read from stdin, so a conversation can be piped in. -v prints speed figures after "
        "each reply. " + SAMPLING_HELP,
    )
    add_model_args(p)
    add_lora_arg(p)
    p.add_argument("--system", metavar="TEXT", help="a system message at the start of the conversation")
    p.add_argument("--template", metavar="NAME",
                   help="use a built-in template (chatml) instead of the model's; needed for models without one")
    add_sampling_args(p, default_n=-1)
    add_spec_args(p)
    p.set_defaults(func=chat)


def chat(args: argparse.Namespace) -> int:
    """The interactive conversation (or one piped in on stdin); returns the exit code."""
    from edge_infer import hub

    params = sampling_params(args)
    engine_options(args)  # fail on a bad -t/--seed/--spec before opening the model
    lora_options(args.lora)
    path = hub.resolve_model(args.model)
    encoder = ChatEncoder.for_model(path, args.template)  # fail before the slow load
    params = encoder.params(params)
    interactive = sys.stdin.isatty()
    llm = load_llm(args, path)
    try:
        if interactive:
            _enable_line_editing()
            print(f"edge-infer chat: {os.path.basename(path)}; {HELP}", file=sys.stderr)
        _repl(llm, encoder, params, args, interactive)
    finally:
        llm.close()
    return 0


def _repl(llm: LLM, encoder: ChatEncoder, params: SamplingParams, args: argparse.Namespace,
          interactive: bool) -> None:
    start: list[Message] = [{"role": "system", "content": args.system}] if args.system is not None else []
    history = list(start)
    while True:
        try:
            line = input(">>> " if interactive else "")
        except EOFError:
            if interactive:
                print()
            return
        except KeyboardInterrupt:
            print("\n(Ctrl-C stops a reply; use /exit or Ctrl-D to quit)", file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/") and " " not in text:
            if text in ("/exit", "/quit", "/bye"):
                return
            if text == "/reset":
                history = list(start)
                print("(history cleared)", file=sys.stderr)
            elif text == "/help":
                print(HELP, file=sys.stderr)
            else:
                print(f"unknown command {text!r}; {HELP}", file=sys.stderr)
            continue
        turn = [*history, {"role": "user", "content": line}]
        reply = _reply(llm, encoder, turn, params, args.verbose, interactive)
        if reply is not None:
            history = [*turn, {"role": "assistant", "content": reply}]


def _reply(llm: LLM, encoder: ChatEncoder, messages: list[Message], params: SamplingParams,
           verbose: int, interactive: bool) -> str | None:
    """Stream one reply to stdout; its text, or None when it failed or was interrupted."""
    final: list[RequestOutput] = []
    wrote = False
    try:
        ids = encoder.encode(llm, messages)
        for delta in stream_request(llm, ids, params, final):
            sys.stdout.write(delta)
            sys.stdout.flush()
            wrote = True
    except KeyboardInterrupt:
        print(flush=True)
        if interactive:
            print("(reply stopped; this turn is not kept)", file=sys.stderr)
        return None
    except EdgeInferError as e:
        if wrote:
            print()
        msg = " ".join(str(e).splitlines()) or type(e).__name__
        print(f"edge-infer: error: {msg} (this turn is not kept; /reset clears the history)", file=sys.stderr)
        return None
    print("\n" if interactive else "", flush=True)
    if verbose and final:
        print_figures(final[0])
    return final[0].outputs[0].text if final else ""


def _enable_line_editing() -> None:
    try:
        import readline  # noqa: F401  (input() gains history and line editing)
    except ImportError:  # pragma: no cover - not on every platform
        pass
