"""Teacher-forced agreement with llama.cpp on the same GGUF file: mean KL(llama.cpp || ours) and
top-1 agreement over the positions of a text, for any model (a weight type's accuracy bar).

    python benchmarks/agreement.py -m FILE.gguf [-f TEXT] [-n 256] [--json]

The text (default: the start of the GPL-3, as tests/models/test_forward_agreement.py) is
tokenized by our tokenizer with BOS where the model adds one; both score the same ids in one
sequence, llama.cpp at its best (tests/support/llama_oracle.py: repacked weights). Position 0 is
left out (qwen2.5's first token carries massive activations, where llama.cpp is far off exact
math). Prints llama.cpp's system info beside the figures. --exact adds both KLs to exact math
(our float path: the file's weights, float32 activations), for types where the two int8
computations differ more from each other than from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llama_oracle import LlamaCpp, kl_rows  # noqa: E402

from edge_infer import LLM  # noqa: E402

GPL3 = Path("/usr/share/common-licenses/GPL-3")


def agreement(model: str, text: str, n_tokens: int, threads: int) -> dict[str, float | int | str]:
    """Mean KL(llama.cpp || ours) and top-1 agreement over positions 1..n_tokens-1."""
    with LLM(model, n_threads=threads, kv_cache_memory="256MiB") as llm:
        ids = llm.tokenizer.encode(text[: 12 * n_tokens], add_special=True)[:n_tokens]
        ours = llm.prompt_logits(ids)
    m = LlamaCpp(Path(model), len(ids))
    try:
        theirs = m.logits(ids)
    finally:
        m.close()
    kl = kl_rows(theirs[1:], ours[1:])
    top1 = float((theirs[1:].argmax(1) == ours[1:].argmax(1)).mean())
    import llama_cpp

    return {"model": model, "tokens": len(ids), "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "top1": top1, "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip()}


def float_logits(model: str, ids: list[int], threads: int) -> np.ndarray:
    """Our float path's logits (every int8 form off: the file's exact weights, float32
    activations): the exact math both int8 computations are measured against."""
    from edge_infer.kernels_cpu import backend

    saved = backend.I8_TYPES, backend.K_TYPES
    backend.I8_TYPES, backend.K_TYPES = {role: () for role in saved[0]}, ()  # type: ignore[assignment]
    try:
        with LLM(model, n_threads=threads, kv_cache_memory="256MiB") as llm:
            return llm.prompt_logits(ids)
    finally:
        backend.I8_TYPES, backend.K_TYPES = saved


def exact_kls(model: str, text: str, n_tokens: int, threads: int) -> dict[str, float]:
    """Mean KL(exact || ours) and KL(exact || llama.cpp), exact = float_logits: which of the two
    int8 computations (ours: activations per 32; llama.cpp's per 256 for the K and IQ types)
    is the nearer to the file's math."""
    with LLM(model, n_threads=threads, kv_cache_memory="256MiB") as llm:
        ids = llm.tokenizer.encode(text[: 12 * n_tokens], add_special=True)[:n_tokens]
        ours = llm.prompt_logits(ids)
    exact = float_logits(model, ids, threads)
    m = LlamaCpp(Path(model), len(ids))
    try:
        theirs = m.logits(ids)
    finally:
        m.close()
    return {"ours_to_exact": float(kl_rows(exact[1:], ours[1:]).mean()),
            "llama_cpp_to_exact": float(kl_rows(exact[1:], theirs[1:]).mean())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="a .gguf path or a known model name")
    ap.add_argument("-f", "--file", type=Path, default=GPL3, help="the text (default: the GPL-3)")
    ap.add_argument("-n", "--n-tokens", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--exact", action="store_true",
                    help="also both KLs to exact math (our float path on the same file: slow for low-bit types)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.file.is_file():
        ap.error(f"--file: {args.file} is not a file")
    from edge_infer import hub

    path, text = str(hub.resolve_model(args.model)), args.file.read_text(encoding="utf-8")
    res = agreement(path, text, args.n_tokens, args.threads)
    if args.exact:
        res |= exact_kls(path, text, args.n_tokens, args.threads)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{res['model']}: {res['tokens']} tokens; mean KL(llama.cpp || ours) {res['mean_kl']:.4f} "
          f"(max {res['max_kl']:.3f}), top-1 agreement {res['top1']:.1%}")
    if args.exact:
        print(f"mean KL to exact math (our float path): ours {res['ours_to_exact']:.4f}, "
              f"llama.cpp's {res['llama_cpp_to_exact']:.4f}")
    print(f"llama.cpp: {res['llama_cpp_system_info']}")
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
