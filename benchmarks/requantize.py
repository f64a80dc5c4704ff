"""Requantize a GGUF file with llama.cpp's own quantizer (llama-cpp-python's
`llama_model_quantize`), for benchmarking other weight types on the same model.

    python benchmarks/requantize.py [-m qwen2.5-coder-1.5b] [--type Q6_K|Q8_0|IQ4_XS|...] [--threads 2]

Writes `<cache>/models/derived/<model>-<TYPE>.gguf` (beside, then renamed: an interrupted run
leaves no half-written file) unless it exists, and prints its path. `pure` is set, so every
matrix gets the type (llama.cpp's mixes would keep some at other types); qwen2.5-coder-1.5b's
widths 1536 and 8960 are multiples of 256, so no K-quant matrix falls back. Then, e.g.:

    edge-infer bench -m "$(python benchmarks/requantize.py --type Q6_K)" -t 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge_infer import hub

FTYPES = {"Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_K": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
          "Q5_K": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
          "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
          "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0"}


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
    ap.add_argument("--type", default="Q6_K", choices=sorted(FTYPES))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("requantize.py needs llama-cpp-python: python benchmarks/llama_cpp_build.py --install")
    print(requantize(args.model, args.type, args.threads))


if __name__ == "__main__":
    main()
