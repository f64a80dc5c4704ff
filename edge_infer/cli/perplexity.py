"""`edge-infer perplexity -f TEXT`: a model's perplexity on a text, as llama-perplexity reports it
(the rules are in edge_infer.bench.perplexity)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edge_infer.cli.args import add_model_args, number, read_text
from edge_infer.cli.common import load_llm
from edge_infer.errors import InvalidRequest


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "perplexity", parents=parents, help="measure a model's perplexity on a text file",
        description="Perplexity computed as llama.cpp's llama-perplexity does: the whole file is "
        "tokenized (with BOS when the model adds one), cut into non-overlapping windows of --ctx "
        "tokens (the first token of each replaced by BOS when the model adds one), and only the "
        "second half of each window is scored. Prints PPL = exp(mean NLL) +/- its uncertainty; "
        "-v prints the running value after each chunk ([1]12.34,[2]...) on stderr.",
    )
    add_model_args(p)
    p.add_argument("-f", "--file", metavar="TEXT", required=True, help="the text file (UTF-8)")
    p.add_argument("--ctx", metavar="N", default="512", help="window size in tokens (default 512)")
    p.add_argument(
        "--chunks", metavar="N", default="-1", help="score at most N windows, -1 = all (default -1)"
    )
    p.add_argument("--kl-base", metavar="BASE.gguf",
                   help="also run this reference model on the same windows and report the mean KL divergence "
                   "KL(base || model), top-1 agreement and the perplexity ratio (llama.cpp's --kl-divergence)")
    p.add_argument("--json", action="store_true",
                   help='print {"model","ctx","chunks","tokens_scored","ppl","ppl_std"} as JSON (with --kl-base: '
                   '"mean_kl","kl_std","top1_agreement","ppl_base","ppl_ratio" too)')
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Score the file and print the perplexity; returns the exit code."""
    from edge_infer.bench.perplexity import perplexity

    ctx = number(args.ctx, "--ctx")
    if ctx < 4:
        raise InvalidRequest(f"--ctx must be at least 4, got {ctx}")
    chunks = number(args.chunks, "--chunks")
    if chunks == 0 or chunks < -1:
        raise InvalidRequest(f"--chunks must be -1 (all) or a positive integer, got {chunks}")
    text = read_text(args.file)
    if not text.strip():
        raise InvalidRequest(f"{args.file}: the file is empty")
    if args.kl_base:
        return _run_kl(args, ctx, chunks, text)
    llm = load_llm(args)
    try:
        tokens = llm.tokenizer.encode(text, add_special=True)
        show_bar = sys.stderr.isatty() and not args.verbose
        bar = _bar(show_bar, min(len(tokens) // ctx, chunks) if chunks > 0 else len(tokens) // ctx)

        def on_chunk(i: int, ppl: float) -> None:
            bar.update(1)
            if args.verbose:
                print(f"[{i}]{ppl:.4f},", end="", file=sys.stderr, flush=True)

        try:
            res = perplexity(llm, tokens, ctx, None if chunks == -1 else chunks, on_chunk=on_chunk)
        finally:
            bar.close()
        if args.verbose:
            print(file=sys.stderr)
    finally:
        llm.close()
    if args.json:
        out = {"model": args.model, "ctx": res.ctx, "chunks": res.chunks, "tokens_scored": res.tokens_scored,
               "ppl": res.ppl, "ppl_std": res.ppl_std}
        print(json.dumps(out))
    else:
        print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_std:.5f} "
              f"({res.chunks} chunks of {res.ctx} tokens, {res.tokens_scored} tokens scored)")
    return 0


def _bar(show: bool, total: int) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, desc="perplexity", unit="chunk", disable=not show, file=sys.stderr, dynamic_ncols=True
    )


def _run_kl(args: argparse.Namespace, ctx: int, chunks: int, text: str) -> int:
    from edge_infer import hub
    from edge_infer.bench.kl_divergence import kl_divergence

    base_path = hub.resolve_model(args.kl_base)
    llm = load_llm(args)
    try:
        base = load_llm(args, base_path)
        try:
            tokens = llm.tokenizer.encode(text, add_special=True)
            if base.tokenizer.encode(text, add_special=True) != tokens:
                raise InvalidRequest(f"{args.kl_base}: the reference model tokenizes the text differently; "
                                     "KL divergence needs the same tokenizer")
            total = min(len(tokens) // ctx, chunks) if chunks > 0 else len(tokens) // ctx
            bar = _bar(sys.stderr.isatty() and not args.verbose, total)

            def on_chunk(i: int, r: Any) -> None:
                bar.update(1)
                if args.verbose:
                    print(f"[{i}] KL {r.mean_kl:.5f} top1 {100 * r.top1:.2f}%", file=sys.stderr, flush=True)

            try:
                res = kl_divergence(llm, base, tokens, ctx, None if chunks == -1 else chunks, on_chunk)
            finally:
                bar.close()
        finally:
            base.close()
    finally:
        llm.close()
    if args.json:
        print(json.dumps({"model": args.model, "base": args.kl_base, **res.as_dict()}))
    else:
        print(f"Mean KL divergence: {res.mean_kl:.6f} +/- {res.kl_std:.6f}")
        print(f"Same top token: {100 * res.top1:.3f}%")
        print(f"PPL: {res.ppl:.4f}, base PPL: {res.ppl_base:.4f}, ratio {res.ppl_ratio:.5f} "
              f"({res.chunks} chunks of {res.ctx} tokens, {res.tokens_scored} tokens scored)")
    return 0
