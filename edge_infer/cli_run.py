"""`edge-infer run`: complete one prompt, streaming the text to stdout as it is generated.

Also the pieces `chat` and `perplexity` share: model options (-m, -t, --max-model-len),
sampling options with llama-cli's defaults, speculative decoding options (`serve` has them too),
and number parsing that fails as one-line InvalidRequest errors (exit 1) rather than argparse
usage errors.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.errors import InvalidRequest
from edge_infer.hub import DEFAULT_MODEL

if TYPE_CHECKING:
    from edge_infer.llm import LLM
    from edge_infer.outputs import RequestOutput
    from edge_infer.sampling_params import SamplingParams

# Flag -> SamplingParams field, so a bad value's message names the flag the user typed.
_FLAGS = {"temperature": "--temp", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
          "repetition_penalty": "--repeat-penalty", "max_tokens": "-n"}  # fmt: skip

SAMPLING_HELP = (
    "sampling defaults follow llama-cli/Ollama: --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05, "
    "--repeat-penalty 1.0 (off), a random seed (pass --seed for repeatable output; --temp 0 is greedy). "
    "The repeat penalty is vLLM's: it applies to every token of the prompt and the output, not only "
    "the last 64 as in llama.cpp."
)


# -- shared option groups ------------------------------------------------------------------------
def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-m",
        "--model",
        default=DEFAULT_MODEL,
        help=f"a known model name (pulled on first use) or a .gguf path (default: {DEFAULT_MODEL})",
    )
    p.add_argument("-t", "--threads", metavar="N", help="compute threads (default: physical cores)")
    p.add_argument("--max-model-len", metavar="N", help="context length (default: the model's, capped by the KV budget)")  # fmt: skip


SPEC_K_MAX = 16  # as SpecConfig allows


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--spec, --draft-model, --spec-k (run, chat and serve); read them with spec_options()."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec", choices=("ngram", "draft"),
                   help="speculative decoding: n-gram prompt lookup, or a draft model; greedy output is "
                   "unchanged and sampled output keeps the model's distribution")  # fmt: skip
    g.add_argument("--draft-model", metavar="M",
                   help="with --spec draft: the draft model (a known name or a .gguf path with the same vocabulary)")  # fmt: skip
    g.add_argument("--spec-k", metavar="K", help=f"tokens proposed per step (1-{SPEC_K_MAX}), or 'auto' to adapt (default 4)")  # fmt: skip


def spec_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `speculative` engine option from --spec/--draft-model/--spec-k; None when off.
    Mistakes are InvalidRequest errors naming the flag."""
    if args.spec is None:
        if args.draft_model is not None or args.spec_k is not None:
            raise InvalidRequest("--draft-model and --spec-k need --spec ngram|draft")
        return None
    spec: dict[str, Any] = {"method": args.spec}
    if args.spec_k is not None:
        spec["k"] = _spec_k(args.spec_k)
    if args.spec == "draft":
        if not args.draft_model:
            raise InvalidRequest("--spec draft needs --draft-model")
        spec["model"] = args.draft_model
    elif args.draft_model is not None:
        raise InvalidRequest("--draft-model is only for --spec draft")
    return spec


def _spec_k(value: str) -> int | str:
    if value.strip().lower() == "auto":
        return "auto"
    try:
        k = int(value)
    except ValueError:
        k = 0
    if not 1 <= k <= SPEC_K_MAX:
        raise InvalidRequest(f"--spec-k must be an integer in 1..{SPEC_K_MAX} or 'auto', got {value!r}")
    return k


def add_sampling_args(p: argparse.ArgumentParser, default_n: int) -> None:
    g = p.add_argument_group("sampling")
    until = "until EOS or the context is full" if default_n < 0 else f"default {default_n}"
    g.add_argument(
        "-n",
        "--n-predict",
        metavar="N",
        default=str(default_n),
        help=f"tokens to generate, -1 = until EOS or the context is full ({until})",
    )
    g.add_argument("--temp", metavar="T", default="0.8", help="temperature, 0 = greedy (default 0.8)")
    g.add_argument(
        "--top-k", metavar="K", default="40", help="keep the K most likely tokens, 0 = off (default 40)"
    )
    g.add_argument("--top-p", metavar="P", default="0.95", help="nucleus sampling, 1.0 = off (default 0.95)")
    g.add_argument(
        "--min-p",
        metavar="P",
        default="0.05",
        help="drop tokens below P x the top probability, 0 = off (default 0.05)",
    )
    g.add_argument(
        "--repeat-penalty", metavar="R", default="1.0", help="repetition penalty, 1.0 = off (default 1.0)"
    )
    g.add_argument("--seed", metavar="S", default="-1", help="random seed, -1 = a random one (default -1)")


def number(value: Any, flag: str, kind: type = int) -> Any:
    """`value` (a string from argv) as int or float, or an InvalidRequest naming `flag`."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise InvalidRequest(f"{flag} must be {what}, got {value!r}") from None


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """LLM keyword options from -t/--max-model-len (and --seed and --spec..., when the command
    has them)."""
    opts: dict[str, Any] = {}
    if args.threads is not None:
        opts["n_threads"] = number(args.threads, "-t/--threads")
        if opts["n_threads"] < 1:
            raise InvalidRequest(f"-t/--threads must be at least 1, got {opts['n_threads']}")
    if args.max_model_len is not None:
        opts["max_model_len"] = number(args.max_model_len, "--max-model-len")
    if hasattr(args, "seed"):
        opts["seed"] = resolve_seed(args)
    if hasattr(args, "spec"):
        spec = spec_options(args)
        if spec is not None:
            opts["speculative"] = spec
    return opts


def resolve_seed(args: argparse.Namespace) -> int:
    """--seed as given, or a fresh random one for -1 (remembered on args for -v)."""
    if getattr(args, "_seed", None) is None:
        seed = number(args.seed, "--seed")
        if seed < -1:
            raise InvalidRequest(f"--seed must be -1 (random) or a non-negative integer, got {seed}")
        args._seed = secrets.randbits(31) if seed == -1 else seed
    return args._seed


def sampling_params(args: argparse.Namespace, **extra: Any) -> SamplingParams:
    """SamplingParams from the sampling flags. The seed lives in the engine (engine_options),
    so successive requests of one session draw different but repeatable random streams."""
    from edge_infer.sampling_params import SamplingParams

    n = number(args.n_predict, "-n")
    if n == 0 or n < -1:
        raise InvalidRequest(f"-n must be -1 (until EOS) or a positive integer, got {n}")
    opts = dict(
        max_tokens=None if n == -1 else n,
        temperature=number(args.temp, "--temp", float),
        top_k=number(args.top_k, "--top-k"),
        top_p=number(args.top_p, "--top-p", float),
        min_p=number(args.min_p, "--min-p", float),
        repetition_penalty=number(args.repeat_penalty, "--repeat-penalty", float),
        **extra,
    )
    try:
        return SamplingParams(**opts)
    except InvalidRequest as e:
        msg = str(e)
        for field, flag in _FLAGS.items():
            if msg.startswith(field + " "):
                msg = flag + msg[len(field) :]
                break
        raise InvalidRequest(msg) from None


def load_llm(args: argparse.Namespace, model: str | os.PathLike[str] | None = None) -> LLM:
    """Load the model named by -m (or `model`); validates the options before the slow part."""
    from edge_infer.llm import LLM

    opts = engine_options(args)
    t0 = time.perf_counter()
    llm = LLM(str(model or args.model), **opts)
    if args.verbose:
        extra = f", seed {opts['seed']}" if "seed" in opts else ""
        spec = opts.get("speculative")
        if spec is not None:
            draft = f" {Path(spec['model']).name}" if "model" in spec else ""
            extra += f", speculative {spec['method']}{draft} k {spec.get('k', 4)}"
        print(f"edge-infer: loaded {Path(llm.plan.model_path).name} in {time.perf_counter() - t0:.2f} s "
              f"({llm.plan.n_threads} threads, context {llm.plan.max_model_len}{extra})", file=sys.stderr)  # fmt: skip
    return llm


# -- streaming -----------------------------------------------------------------------------
def stream_request(llm: LLM, prompt: str | list[int], params: SamplingParams,
                   final: list[RequestOutput]) -> Iterator[str]:  # fmt: skip
    """Text deltas of one request; the last RequestOutput is appended to `final`."""
    return llm.stream(prompt, params, final=final)


def print_figures(out: RequestOutput) -> None:
    """Prompt size, time to first token and decode speed of a finished request, on stderr."""
    m = out.metrics
    n_prompt = len(out.prompt_token_ids)
    n_gen = len(out.outputs[0].token_ids)
    lines = []
    ttft = m.time_to_first_token if m else None
    if ttft is not None:
        rate = f" ({n_prompt / ttft:.1f} tokens/s)" if ttft > 0 else ""
        lines.append(f"prompt: {n_prompt} tokens, time to first token {ttft * 1000:.0f} ms{rate}")
    else:
        lines.append(f"prompt: {n_prompt} tokens")
    if m and m.first_token_time is not None and m.last_token_time is not None and n_gen > 1:
        dt = m.last_token_time - m.first_token_time  # the n_gen - 1 tokens after the first
        speed = f"{(n_gen - 1) / dt:.1f} tokens/s" if dt > 0 else "n/a"
        lines.append(f"decode: {n_gen} tokens, {speed} after the first")
    else:
        lines.append(f"decode: {n_gen} tokens")
    lines[-1] += f", finish reason: {out.finish_reason}"
    for line in lines:
        print(f"edge-infer: {line}", file=sys.stderr)


def print_spec_figures(llm: LLM) -> None:
    """Speculative decoding's acceptance rate and tokens per step so far, on stderr (nothing
    when speculation is off)."""
    m = llm.metrics()
    if "spec_proposed_tokens" not in m:
        return
    print(f"edge-infer: speculative: {m['spec_accepted_tokens']:.0f} of {m['spec_proposed_tokens']:.0f} "
          f"proposed tokens accepted ({m['spec_acceptance_rate']:.0%}), "
          f"{m['spec_tokens_per_step']:.2f} tokens per step", file=sys.stderr)  # fmt: skip


# -- run -----------------------------------------------------------------------------------
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


def read_text(path: str) -> str:
    """A UTF-8 text file, or an InvalidRequest naming the path."""
    p = Path(path).expanduser()
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidRequest(f"{p}: no such file") from None
    except IsADirectoryError:
        raise InvalidRequest(f"{p}: is a directory, not a text file") from None
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"{p}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise InvalidRequest(f"{p}: cannot read: {e.strerror}") from None


def run(args: argparse.Namespace) -> int:
    if (args.system is not None or args.template is not None) and not args.chat:
        raise InvalidRequest("--system and --template need --chat")
    text = read_prompt(args)
    params = sampling_params(args)
    engine_options(args)  # fail on a bad -t/--seed before loading anything
    encoder = None
    model: str | Path = args.model
    if args.chat:
        from edge_infer import hub
        from edge_infer.cli_chat import ChatEncoder

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
