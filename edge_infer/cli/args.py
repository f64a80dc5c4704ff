"""The options several commands share: model (-m, -t, --max-model-len), sampling with
llama-cli's defaults, speculative decoding, and reading them into engine and sampling options.

Numbers are parsed here rather than by argparse, so that a bad value is a one-line
InvalidRequest naming the flag (exit 1) rather than an argparse usage error.
"""

from __future__ import annotations

import argparse
import math
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_infer.errors import InvalidRequest
from edge_infer.hub import DEFAULT_MODEL

if TYPE_CHECKING:
    from edge_infer.sampling_params import SamplingParams

# Flag -> SamplingParams field, so a bad value's message names the flag the user typed.
_FLAGS = {"temperature": "--temp", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
          "repetition_penalty": "--repeat-penalty", "max_tokens": "-n"}

SAMPLING_HELP = (
    "sampling defaults follow llama-cli/Ollama: --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05, "
    "--repeat-penalty 1.0 (off), a random seed (pass --seed for repeatable output; --temp 0 is greedy). "
    "The repeat penalty is vLLM's: it applies to every token of the prompt and the output, not only "
    "the last 64 as in llama.cpp."
)

SPEC_K_MAX = 16  # as SpecConfig allows


# -- option groups -------------------------------------------------------------------------------
def add_model_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    """-m/--model, -t/--threads, --max-model-len (run, chat, perplexity and serve); many: -m may
    be repeated (serve: a list, None when not given)."""
    if many:
        p.add_argument("-m", "--model", action="append", metavar="MODEL",
                       help="a known model name (pulled on first use) or a .gguf path; repeat it to serve several "
                       f"(default: {DEFAULT_MODEL})")
    else:
        p.add_argument(
            "-m",
            "--model",
            default=DEFAULT_MODEL,
            help=f"a known model name (pulled on first use) or a .gguf path (default: {DEFAULT_MODEL})",
        )
    p.add_argument("-t", "--threads", metavar="N", help="compute threads (default: physical cores)")
    p.add_argument("--max-model-len", metavar="N", help="context length (default: the model's, capped by the KV budget)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to run: auto = an NVIDIA GPU when numba-cuda (the [cuda] extra) finds one and "
                   "the model is supported, else the CPU (default auto)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="CUDA: launch every step's kernels instead of replaying CUDA graphs (slower; for debugging)")
    add_kv_type_args(p)
    add_prefix_disk_args(p)
    p.add_argument("--mmproj", metavar="FILE", default=None,
                   help="the model's multimodal projector .gguf (llama.cpp's --mmproj): images in chat messages")
    p.add_argument("--context-shift", action="store_true",
                   help="when a generation fills the context, drop its oldest messages after the first one (a chat) "
                   "or half of it after --keep tokens, and go on (llama.cpp's --context-shift; default: finish "
                   "with 'length')")
    p.add_argument("--keep", metavar="N", default=None,
                   help="with --context-shift: the tokens after BOS never dropped, and llama.cpp's rule of "
                   "dropping half (llama.cpp's --keep; default: a chat's first message, whole messages dropped)")


def add_kv_type_args(p: argparse.ArgumentParser) -> None:
    """--kv-cache-dtype, --kv-cache-dtype-v (llama.cpp's --cache-type-k / --cache-type-v)."""
    from edge_infer.config import KV_CACHE_DTYPES

    p.add_argument("--kv-cache-dtype", metavar="TYPE", default=None,
                   help=f"the KV cache's type, K and V ({', '.join(KV_CACHE_DTYPES)}; default f16); the quantized "
                   "types are llama.cpp's (-ctk), stored rotated as llama.cpp does")
    p.add_argument("--kv-cache-dtype-v", metavar="TYPE", default=None,
                   help="V's type when it should differ from K's (llama.cpp's -ctv; default: --kv-cache-dtype's)")


def add_prefix_disk_args(p: argparse.ArgumentParser) -> None:
    """--prefix-cache-dir, --prefix-cache-disk-size (run, chat, perplexity, serve)."""
    p.add_argument("--prefix-cache-dir", metavar="DIR", default=None,
                   help="keep full KV blocks on disk here (evicted ones and, at exit, all): a later process "
                   "re-using a long system or RAG prompt loads them instead of computing them")
    p.add_argument("--prefix-cache-disk-size", metavar="SIZE", default=None,
                   help="with --prefix-cache-dir: the most it may hold, least recently used out first (default 8GiB)")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--spec, --draft-model, --spec-k (run, chat and serve); read them with spec_options()."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec", choices=("ngram", "draft"),
                   help="speculative decoding: n-gram prompt lookup, or a draft model; greedy output is "
                   "unchanged and sampled output keeps the model's distribution")
    g.add_argument("--draft-model", metavar="M",
                   help="with --spec draft: the draft model (a known name or a .gguf path with the same vocabulary)")
    g.add_argument("--spec-k", metavar="K", help=f"tokens proposed per step (1-{SPEC_K_MAX}), or 'auto' to adapt (default 4)")


def add_sampling_args(p: argparse.ArgumentParser, default_n: int) -> None:
    """-n, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed; read with sampling_params()."""
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


# -- reading the options -------------------------------------------------------------------------
def number(value: Any, flag: str, kind: type = int) -> Any:
    """`value` (a string from argv) as int or float, or an InvalidRequest naming `flag`."""
    try:
        return kind(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise InvalidRequest(f"{flag} must be {what}, got {value!r}") from None


def int_option(value: str | None, flag: str, low: int | None = None) -> int | None:
    """An optional integer flag: None when not given, else at least `low` (when given)."""
    if value is None:
        return None
    n: int = number(value, flag)
    if low is not None and n < low:
        raise InvalidRequest(f"{flag} must be at least {low}, got {n}")
    return n


def engine_options(args: argparse.Namespace, *, min_model_len: int | None = None) -> dict[str, Any]:
    """Engine keyword options (for LLM or EngineConfig.from_options) from the flags the command
    has: -t and --max-model-len, and where present --max-num-seqs, --kv-cache-memory, --seed and
    --spec/--draft-model/--spec-k. `min_model_len`: check --max-model-len's lower bound here, naming
    the flag (serve); otherwise the engine's config checks it."""
    opts: dict[str, Any] = {}
    # (flag, argparse name, engine option, lowest value or None)
    checks = [("-t/--threads", "threads", "n_threads", 1),
              ("--max-model-len", "max_model_len", "max_model_len", min_model_len)]
    if hasattr(args, "max_num_seqs"):
        checks.append(("--max-num-seqs", "max_num_seqs", "max_num_seqs", 1))
    for flag, attr, key, low in checks:
        v = int_option(getattr(args, attr), flag, low)
        if v is not None:
            opts[key] = v
    if getattr(args, "device", None) is not None:
        opts["device"] = args.device
    if getattr(args, "enforce_eager", False):
        opts["enforce_eager"] = True
    if getattr(args, "kv_cache_memory", None) is not None:
        opts["kv_cache_memory"] = args.kv_cache_memory
    opts.update(kv_type_options(args))
    if getattr(args, "mmproj", None) is not None:
        opts["mmproj"] = args.mmproj
    if getattr(args, "context_shift", False):
        opts["context_shift"] = True
    keep = int_option(getattr(args, "keep", None), "--keep", 0)
    if keep is not None:
        if not getattr(args, "context_shift", False):
            raise InvalidRequest("--keep needs --context-shift")
        opts["context_keep"] = keep
    if getattr(args, "prefix_cache_dir", None) is not None:
        opts["prefix_cache_dir"] = args.prefix_cache_dir
    if getattr(args, "prefix_cache_disk_size", None) is not None:
        if getattr(args, "prefix_cache_dir", None) is None:
            raise InvalidRequest("--prefix-cache-disk-size needs --prefix-cache-dir")
        opts["prefix_cache_disk_size"] = args.prefix_cache_disk_size
    if hasattr(args, "seed"):
        opts["seed"] = resolve_seed(args)
    if hasattr(args, "spec"):
        spec = spec_options(args)
        if spec is not None:
            opts["speculative"] = spec
    return opts


def add_lora_arg(p: argparse.ArgumentParser) -> None:
    """run's and chat's --lora: adapters loaded with the model and applied to every reply."""
    p.add_argument("--lora", action="append", metavar="[NAME=]FILE[:SCALE]", default=None,
                   help="a LoRA adapter .gguf (llama.cpp's) applied at SCALE (default 1); repeatable: all of them "
                   "apply, as llama-cli's --lora")


def lora_options(values: Sequence[str] | None) -> tuple[tuple[str, str, float], ...]:
    """--lora NAME=FILE[:SCALE] values (or FILE[:SCALE], named by the file's stem, as llama-server's
    --lora FILE) as EngineConfig's `adapters`: ((name, path, scale), ...), scale 1 by default. A
    bad value (an empty name, a missing file, a scale that is not a finite number, a name given
    twice) is an InvalidRequest naming the flag."""
    out: list[tuple[str, str, float]] = []
    for value in values or ():
        name, sep, rest = value.partition("=")
        if not sep or Path(value).expanduser().is_file():  # FILE alone (an '=' in its path too)
            name, rest = "", value
        elif not name.strip():
            raise InvalidRequest(f"--lora {value!r}: the adapter's name before '=' is empty (--lora NAME=FILE[:SCALE])")
        path, scale = _lora_file(value, rest)
        name = name or Path(path).stem
        if any(name == n for n, _, _ in out):
            raise InvalidRequest(f"--lora: two adapters are named {name!r}; name them apart with --lora NAME=FILE")
        out.append((name, path, scale))
    return tuple(out)


def _lora_file(value: str, rest: str) -> tuple[str, float]:
    """(path, scale) of a --lora value's FILE[:SCALE] part; the file must exist."""
    path, scale = rest, 1.0
    head, colon, tail = rest.rpartition(":")
    if colon and not Path(rest).expanduser().is_file():
        try:
            given: float | None = float(tail)
        except ValueError:
            given = None
        if given is not None or Path(head).expanduser().is_file():
            if given is None or not math.isfinite(given):
                raise InvalidRequest(f"--lora {value!r}: the scale after ':' must be a finite number, got {tail!r}")
            path, scale = head, given
    if not path:
        raise InvalidRequest(f"--lora {value!r}: no adapter file given (--lora NAME=FILE[:SCALE])")
    p = Path(path).expanduser()
    if not p.is_file():
        raise InvalidRequest(f"--lora {value!r}: {path}: " + ("is a directory, not an adapter .gguf" if p.is_dir()
                                                            else "no such file"))
    return str(p), scale


def kv_type_options(args: argparse.Namespace) -> dict[str, str]:
    """kv_cache_dtype / kv_cache_dtype_v from the flags, checked here so that a bad one names the flag."""
    from edge_infer.config import KV_CACHE_DTYPES

    opts = {}
    for flag, attr in (("--kv-cache-dtype", "kv_cache_dtype"), ("--kv-cache-dtype-v", "kv_cache_dtype_v")):
        v = getattr(args, attr, None)
        if v is not None:
            if v not in KV_CACHE_DTYPES:
                raise InvalidRequest(f"{flag} must be one of {', '.join(KV_CACHE_DTYPES)}, got {v!r}")
            opts[attr] = v
    return opts


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


def read_text(path: str) -> str:
    """A UTF-8 text file (-f), or an InvalidRequest naming the path."""
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
