"""Requantize a GGUF file with llama.cpp's own quantizer (llama-cpp-python's
`llama_model_quantize`), for benchmarking other weight types on the same model.

    python benchmarks/requantize.py [-m qwen2.5-coder-1.5b] [--type Q6_K|Q8_0|IQ4_XS|...] [--threads 2]

Writes `<cache>/models/derived/<model>-<TYPE>.gguf` (beside, then renamed: an interrupted run
leaves no half-written file) unless it exists, and prints its path. `pure` is set, so every
matrix gets the type (llama.cpp's mixes would keep some at other types); qwen2.5-coder-1.5b's
widths 1536 and 8960 are multiples of 256, so no K-quant matrix falls back. Then, e.g.:

    edge-infer bench -m "$(python benchmarks/requantize.py --type Q6_K)" -t 2

The types llama.cpp quantizes only with an importance matrix (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M;
IQ3_XXS too, as llama-quantize uses one when given) take `--imatrix FILE` (llama-imatrix's GGUF
format, e.g. from `edge-infer quantize IN OUT --type q4_k --calibrate TEXT --save-imatrix FILE`).
llama_model_quantize's C++ imatrix map cannot be built through ctypes, so each matrix goes
through the function it calls per chunk of rows, ggml's `ggml_quantize_chunk`, with the
matrix's importance: the same bytes. Every matrix gets the type but the token embedding (Q4_K)
and the output (Q5_K, llama.cpp's choice for these types): llama-imatrix leaves the output out
by default, and llama.cpp refuses these types without an importance. Written to
`<model>-<TYPE>-imatrix.gguf`. With `--mix`, llama.cpp's plan for the file type of that name
instead (attn_v, the first ffn_downs, the output and embedding at other types, as
llama-quantize IN OUT IQ2_XS --imatrix F writes it; `-mix`). With `--ours`, edge-infer's
quantizer writes the same plan (`-ours`): its grid matrices should be the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from edge_infer import hub  # noqa: E402

FTYPES = {"Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_K": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
          "Q5_K": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
          "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
          "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0", "IQ3_S": "LLAMA_FTYPE_MOSTLY_IQ3_S",
          "IQ3_XXS": "LLAMA_FTYPE_MOSTLY_IQ3_XXS"}


IMATRIX_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")


def requantize_imatrix(model: str, qtype: str, imatrix: Path, ours: bool = False, mix: bool = False) -> Path:
    """The copy of `model` quantized to qtype by ggml_quantize_chunk (ours: by edge-infer's
    quantizer, the same plan) under the importance matrix at `imatrix` (made if missing); mix:
    llama.cpp's plan for the file type of that name (as llama-quantize IN OUT IQ2_XS)."""
    from gguf import GGMLQuantizationType as T
    from gguf import LlamaFileType as FT
    from quant_helpers import ggml_requantize

    from edge_infer.formats.imatrix import Imatrix
    from edge_infer.formats.quant_policy import Target, parse_target
    from edge_infer.formats.requantize import requantize as ours_requantize

    src = hub.resolve_model(model)
    name = model if model in hub.KNOWN_MODELS else Path(model).stem
    tag = f"{'-mix' if mix else ''}{'-ours' if ours else ''}"
    dst = hub.cache_dir() / "models" / "derived" / f"{name}-{qtype}-imatrix{tag}.gguf"
    keep = [] if mix else [("token_embd.weight", T.Q4_K), ("output.weight", T.Q5_K)]
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        if ours:
            target = parse_target(qtype) if mix else Target(qtype.lower(), T[qtype], FT[f"MOSTLY_{qtype}"], mix=False)
            ours_requantize(src, dst, target, keep, Imatrix.load(imatrix))
        else:
            ggml_requantize(src, dst, T[qtype], Imatrix.load(imatrix), keep=keep, mix=qtype.lower() if mix else None)
    return dst


def requantize(model: str, qtype: str, threads: int) -> Path:
    """The requantized copy of `model` (made if missing)."""
    import llama_cpp as lc

    src = hub.resolve_model(model)
    name = model if model in hub.KNOWN_MODELS else Path(model).stem
    dst = hub.cache_dir() / "models" / "derived" / f"{name}-{qtype}.gguf"
    if dst.exists():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(dst.name + ".part")
    params = lc.llama_model_quantize_default_params()
    params.ftype = getattr(lc, FTYPES[qtype])
    params.nthread = threads
    params.allow_requantize = True
    params.pure = True
    rc = lc.llama_model_quantize(str(src).encode(), str(part).encode(), params)
    if rc != 0:
        part.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize failed with code {rc}")
    part.replace(dst)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--type", default="Q6_K", choices=sorted({*FTYPES, *IMATRIX_TYPES}))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--imatrix", type=Path, help="an importance matrix: ggml_quantize_chunk under it (module docstring)")
    ap.add_argument("--ours", action="store_true", help="with --imatrix: edge-infer's quantizer, the same plan")
    ap.add_argument("--mix", action="store_true", help="with --imatrix: llama.cpp's plan for the file type (its mix)")
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("requantize.py needs llama-cpp-python: python benchmarks/llama_cpp_build.py --install")
    if args.imatrix is not None:
        if args.type not in IMATRIX_TYPES:
            sys.exit(f"--imatrix is for {', '.join(IMATRIX_TYPES)}")
        print(requantize_imatrix(args.model, args.type, args.imatrix, args.ours, args.mix))
    elif args.type not in FTYPES:
        sys.exit(f"{args.type} needs an importance matrix: --imatrix FILE")
    else:
        print(requantize(args.model, args.type, args.threads))


if __name__ == "__main__":
    main()
