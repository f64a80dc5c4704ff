#!/usr/bin/env python3
"""Greedy generation of tiny llama models, one per int8 weight path (Q8_0 and Q4_0: the int8
kernel; Q4_K: the K-quant kernel; IQ4_NL and IQ4_XS: their table formats), to compare an aarch64 run with the x86 one token for token.

    DIR/py scripts/arm_parity.py --write aarch64.json      # under qemu (scripts/arm_check.sh)
    python scripts/arm_parity.py --check aarch64.json      # on the x86 host

The models are written from fixed seeds (tests/support/tiny_models.py), so both runs see the
same bytes; it prints LLVM's CPU name and the int8 path it chose.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from tiny_models import write_tiny_llama  # noqa: E402

from edge_infer import LLM, SamplingParams  # noqa: E402
from edge_infer.kernels_cpu import target  # noqa: E402

TYPES = ("Q8_0", "Q4_0", "Q4_K", "IQ4_NL", "IQ4_XS")
PROMPT = [1, 17, 42, 99, 7, 123, 55, 8, 200, 31]


def generate() -> dict[str, list[int]]:
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for qtype in TYPES:
            path = write_tiny_llama(Path(d) / f"{qtype}.gguf", qtype=qtype, n_layers=2, d_model=256, ffn=512, seed=3)
            with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
                res = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
                out[qtype] = list(res[0].outputs[0].token_ids)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    args = ap.parse_args()
    here = f"{platform.machine()} (LLVM CPU {target.cpu_name()}, int8 path {target.int8_isa()})"
    print(here, flush=True)
    got = generate()
    if args.write:
        Path(args.write).write_text(json.dumps({"machine": here, "tokens": got}))
        print("greedy tokens written:", got)
        return 0
    other = json.loads(Path(args.check).read_text())
    want = other["tokens"]
    bad = [t for t in TYPES if got[t] != want[t]]
    for t in TYPES:
        print(f"{t}: {'same' if t not in bad else 'DIFFERENT'} greedy tokens as {other['machine']}: {got[t]}"
              + (f" (there: {want[t]})" if t in bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
