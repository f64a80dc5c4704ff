"""`edge-infer run`: complete one prompt, streaming the text to stdout as it is generated."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.cli.args import (
    SAMPLING_HELP,
    add_lora_arg,
    add_model_args,
    add_sampling_args,
    add_spec_args,
    engine_options,
    lora_options,
    read_text,
    sampling_params,
)
from edge_infer.cli.common import ChatEncoder, load_llm, print_figures, print_spec_figures, stream_request
from edge_infer.errors import InvalidRequest

if TYPE_CHECKING:
    from edge_infer.engine.image_prompt import MultimodalPrompt
    from edge_infer.outputs import RequestOutput


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", parents=parents, help="complete a prompt, streaming the text to stdout",
        description="Complete a prompt with a model and stream the generated text (not the prompt) "
        "to stdout. The prompt is PROMPT, -p, the file of -f, or stdin (PROMPT '-' or piped input). "
        "The default model is pulled on first use. -v prints load time, prompt tokens, time to "
        "first token and decode speed on stderr (and, with --spec, the acceptance rate and tokens per "
        "step). A model whose GGUF has a chat template (and does not call itself a base model) gets the "
        "prompt as a user message in it, as llama-cli and Ollama do; --raw continues the text instead. "
        + SAMPLING_HELP,
    )
    p.add_argument("prompt_arg", nargs="?", metavar="PROMPT", help="the prompt text, or - to read stdin")
    p.add_argument("-p", "--prompt", help="the prompt text")
    p.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE (UTF-8)")
    add_model_args(p)
    add_sampling_args(p, default_n=128)
    add_spec_args(p)
    add_lora_arg(p)
    mode = p.add_argument_group("chat template")
    pick = mode.add_mutually_exclusive_group()
    pick.add_argument("--chat", action="store_true",
                      help="wrap the prompt as one user message in the model's chat template (the default "
                      "for a model with a template that does not call itself a base model)")
    pick.add_argument("--raw", action="store_true", help="plain completion: continue the prompt text as it is")
    mode.add_argument("--system", metavar="TEXT", help="a system message before the prompt (chat mode)")
    mode.add_argument("--template", metavar="NAME", help="force a built-in chat template (chatml)")
    mode.add_argument("--image", action="append", metavar="FILE", default=None,
                      help="an image before the prompt in the user message (repeatable; needs --mmproj)")
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


def chat_mode(args: argparse.Namespace, path: Path) -> tuple[bool, str]:
    """Whether to use a chat template (--chat, --system or --template; not --raw; else what
    the model's file suggests) and why, in words for -v."""
    if args.raw:
        if args.system is not None or args.template is not None:
            raise InvalidRequest("--system and --template are for chat mode: drop --raw")
        return False, "--raw"
    if args.chat or args.system is not None or args.template is not None:
        return True, "asked for"
    from edge_infer.chat import chat_by_default
    from edge_infer.formats.gguf import GGUFFile

    with GGUFFile(path) as f:
        return chat_by_default(f.metadata)


def run(args: argparse.Namespace) -> int:
    """Stream the completion of the prompt to stdout; returns the exit code."""
    from edge_infer import hub

    text = read_prompt(args)
    images = args.image or []
    if images and args.mmproj is None:
        raise InvalidRequest("--image needs --mmproj FILE (the model's multimodal projector)")
    if images and args.raw:
        raise InvalidRequest("--image goes into the chat template's user message: drop --raw")
    params = sampling_params(args)
    engine_options(args)  # fail on a bad -t/--seed (or --lora) before loading anything
    lora_options(args.lora)
    model = hub.resolve_model(args.model)
    chat, why = chat_mode(args, model) if not images else (True, "--image")
    encoder = ChatEncoder.for_model(model, args.template) if chat else None  # no template: fail before the load
    llm = load_llm(args, model)
    try:
        prompt: str | list[int] | MultimodalPrompt = text
        if encoder is not None:
            messages: list[dict[str, Any]] = [{"role": "system", "content": args.system}] if args.system is not None else []
            content: Any = text if not images else [*({"type": "image", "image": i} for i in images),
                                                   {"type": "text", "text": text}]
            prompt = encoder.encode(llm, [*messages, {"role": "user", "content": content}])
            params = encoder.params(params)
        if args.verbose:
            how = "chat mode" if encoder else "plain completion"
            hint = "; --raw for plain completion" if encoder and why != "asked for" else ""
            print(f"edge-infer: {how} ({why}{hint})", file=sys.stderr)
        final: list[RequestOutput] = []
        written = ""
        for delta in stream_request(llm, prompt, params, final):
            sys.stdout.write(delta)
            sys.stdout.flush()
            written += delta
        if not written.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if not written.strip():
            explain_empty(final[0] if final else None, chat, model)
        if args.verbose and final:
            print_figures(final[0])
            print_spec_figures(llm)
    finally:
        llm.close()
    return 0


def explain_empty(out: RequestOutput | None, chat: bool, model: Path) -> None:
    """One stderr line for an answer with no visible text: why, and what to try."""
    n = len(out.outputs[0].token_ids) if out is not None and out.outputs else 0
    reason = out.finish_reason if out is not None else None
    what = "ended at once" if reason == "stop" and n <= 1 else f"wrote only whitespace ({n} tokens, {reason})"
    if chat:
        hint = "try --raw for plain completion, or rephrase the prompt"
    else:
        from edge_infer.formats.gguf import GGUFFile

        with GGUFFile(model) as f:
            has_template = bool(str(f.metadata.get("tokenizer.chat_template") or "").strip())
        hint = "try --chat (the model has a chat template)" if has_template else "try a longer or different prompt"
    print(f"edge-infer: the model {what}: {hint}", file=sys.stderr)
