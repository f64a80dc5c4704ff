"""`edge-infer quantize IN OUT --type T`: requantize a GGUF model (formats/requantize.py), with
a llama.cpp-style mix, per-tensor overrides and importance-weighted scales from calibration
text or an imatrix file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from edge_infer.cli.args import number, read_text
from edge_infer.errors import InvalidRequest

TYPES_HELP = ("plain: f32 f16 q8_0 q6_k q5_k q5_1 q5_0 q4_k q4_1 q4_0 q3_k q2_k iq4_xs iq4_nl; mixes as llama.cpp's "
              "file types: "
              "q5_k_m q4_k_m q4_k_s q3_k_l q3_k_m q2_k_m (llama.cpp's Q2_K) iq3_m iq3_s iq3_xxs iq2_m iq2_s iq2_xs "
              "iq2_xxs iq1_m iq1_s (iq2_xs, iq2_xxs, iq1_s need --imatrix or --calibrate)")


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "quantize", parents=parents, help="requantize a GGUF model to another type or mix",
        description="Writes OUT from IN with every weight dequantized and quantized again (a tensor "
        "already of its new type is copied as it is), the metadata and tokenizer carried over. The "
        "output matrix gets Q6_K as llama.cpp gives it; a K-quant on rows that are not a multiple of "
        "256 falls back to a 32-element type, as in llama.cpp. With --calibrate or --imatrix the block "
        "scales minimise the error weighted by each input channel's mean squared activation (llama.cpp's "
        "imatrix).",
    )
    p.add_argument("input", metavar="IN", help="the source model: a .gguf path or a known model name")
    p.add_argument("output", metavar="OUT", help="the .gguf file to write")
    p.add_argument("--type", required=True, metavar="T", help=TYPES_HELP)
    p.add_argument("--keep", action="append", default=[], metavar="PATTERN=TYPE",
                   help="give tensors matching a glob this type, e.g. 'blk.0.*=q8_0' 'output.weight=q6_k' "
                   "(repeatable; the first matching pattern wins)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--calibrate", metavar="FILE", help="collect an importance matrix by running IN over this text")
    src.add_argument("--imatrix", metavar="FILE", help="use this importance matrix (llama-imatrix's GGUF format)")
    p.add_argument("--save-imatrix", metavar="FILE", help="with --calibrate: also write the importance matrix here")
    p.add_argument("--ctx", metavar="N", default="512", help="calibration window in tokens (default 512)")
    p.add_argument("--chunks", metavar="N", default="-1", help="calibrate on at most N windows, -1 = all (default -1)")
    p.add_argument("-t", "--threads", metavar="N", help="threads (default: all cores)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _calibrate(args: argparse.Namespace, model: Path, threads: int | None) -> Any:
    from edge_infer.llm import LLM
    from edge_infer.quantize.calibrate import collect_imatrix

    ctx = number(args.ctx, "--ctx")
    chunks = number(args.chunks, "--chunks")
    if chunks == 0 or chunks < -1:
        raise InvalidRequest(f"--chunks must be -1 (all) or a positive integer, got {chunks}")
    text = read_text(args.calibrate)
    opts: dict[str, Any] = {"device": "cpu", "max_model_len": max(ctx + 1, 1024)}
    if threads:
        opts["n_threads"] = threads
    with LLM(str(model), **opts) as llm:
        tokens = llm.tokenizer.encode(text, add_special=True)
        total = min(len(tokens) // ctx, chunks) if chunks > 0 else len(tokens) // ctx
        bar = _bar(total, "calibrating", "chunk", args)
        try:
            im = collect_imatrix(llm, tokens, ctx, None if chunks == -1 else chunks, Path(args.calibrate).name,
                                 on_chunk=lambda i: bar.update(1))
        finally:
            bar.close()
    if args.save_imatrix:
        im.save(args.save_imatrix)
    return im


def _check_importance(base: Any, keep: list[Any], args: argparse.Namespace) -> None:
    """IQ2_XXS, IQ2_XS and IQ1_S are only written under an importance matrix (as llama-quantize)."""
    from edge_infer.formats.weight_types import weight_type

    needs = [t.name for t in (base, *(kt for _, kt in keep)) if weight_type(t).needs_importance]
    if needs and not (args.imatrix or args.calibrate):
        raise InvalidRequest(f"--type {args.type}: {needs[0]} needs an importance matrix; pass --imatrix FILE "
                             "(llama-imatrix's) or --calibrate TEXT")


def run(args: argparse.Namespace) -> int:
    from edge_infer import hub
    from edge_infer.formats.imatrix import Imatrix
    from edge_infer.formats.quant_policy import parse_keep, parse_target
    from edge_infer.formats.requantize import check_output, requantize

    target = parse_target(args.type)
    keep = [parse_keep(k) for k in args.keep]
    _check_importance(target.base, keep, args)
    out = Path(args.output).expanduser()
    check_output(args.input, out, args.force)  # before a download or a calibration, not after
    if args.save_imatrix and not args.calibrate:
        raise InvalidRequest("--save-imatrix needs --calibrate (it saves what calibration collected)")
    threads = number(args.threads, "--threads") if args.threads else None
    if threads is not None:
        import numba

        if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:  # type: ignore[attr-defined]
            raise InvalidRequest(f"--threads must be 1..{numba.config.NUMBA_NUM_THREADS}, got {threads}")  # type: ignore[attr-defined]
        numba.set_num_threads(threads)
    model = hub.resolve_model(args.input)
    check_output(model, out, args.force)  # a known name resolved to the output's path
    t0 = time.perf_counter()
    im, extra = None, {}
    if args.calibrate:
        im = _calibrate(args, Path(model), threads)
    elif args.imatrix:
        im = Imatrix.load(args.imatrix)
    if im is not None:
        extra = {"quantize.imatrix.file": Path(args.save_imatrix or args.imatrix or args.calibrate).name,
                 "quantize.imatrix.dataset": ",".join(im.datasets) or "unknown",
                 "quantize.imatrix.entries_count": len(im.sums), "quantize.imatrix.chunks_count": im.chunk_count}
    from edge_infer.formats.gguf import GGUFFile

    with GGUFFile(model) as f:
        total = sum(t.n_elements for t in f.tensors.values())
    bar = _bar(total, "quantizing", "weight", args, scale=True)
    try:
        steps = requantize(model, out, target, keep, im, args.force, lambda name, n: bar.update(n), extra)
    finally:
        bar.close()
    _summary(steps, args, out, time.perf_counter() - t0)
    return 0


def _summary(steps: list[Any], args: argparse.Namespace, out: Path, seconds: float) -> None:
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for p in steps:
        r = rows[p.new_type.name]
        r[0], r[1], r[2], r[3] = r[0] + 1, r[1] + p.n_elements, r[2] + p.src_bytes, r[3] + p.new_bytes
    n = sum(p.n_elements for p in steps)
    before, after = sum(p.src_bytes for p in steps), sum(p.new_bytes for p in steps)
    if args.json:
        print(json.dumps({"output": str(out), "type": args.type, "seconds": round(seconds, 2),
                          "bytes_before": before, "bytes_after": after, "bits_per_weight": 8 * after / n,
                          "types": {k: {"tensors": v[0], "elements": v[1], "bytes_before": v[2], "bytes_after": v[3]}
                                    for k, v in sorted(rows.items())}}))
        return
    print(f"{'type':<6} {'tensors':>7} {'weights':>13} {'before MB':>10} {'after MB':>9}")
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1][3]):
        print(f"{k:<6} {v[0]:>7} {v[1]:>13,} {v[2] / 1e6:>10.1f} {v[3] / 1e6:>9.1f}")
    print(f"{'total':<6} {len(steps):>7} {n:>13,} {before / 1e6:>10.1f} {after / 1e6:>9.1f}  "
          f"({8 * before / n:.2f} -> {8 * after / n:.2f} bits per weight)")
    print(f"wrote {out} in {seconds:.1f} s")


def _bar(total: int, desc: str, unit: str, args: argparse.Namespace, scale: bool = False) -> Any:
    from tqdm import tqdm

    show = sys.stderr.isatty() and not args.quiet
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, disable=not show, file=sys.stderr,
                dynamic_ncols=True)
