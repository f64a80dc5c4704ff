"""`edge-infer convert HF_DIR OUT.gguf [--type f16|q8_0|f32]`: a Hugging Face model folder to a
GGUF file, as llama.cpp's convert_hf_to_gguf.py writes it (edge_infer/convert/)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from edge_infer.convert import OUT_TYPES
from edge_infer.errors import InvalidRequest


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "convert", parents=parents, help="convert a Hugging Face model folder to GGUF",
        description="Writes OUT from the Hugging Face folder HF_DIR (config.json, model.safetensors, "
        "tokenizer.json or vocab.txt, and sentence-transformers' modules.json + 1_Pooling when present) "
        "with the keys, tensor names and types llama.cpp's convert_hf_to_gguf.py writes. Supported: "
        "BertModel, BertForMaskedLM, BertForSequenceClassification (bert); NomicBertModel (nomic-bert: "
        "nomic-embed-text v1, v1.5); ModernBertModel, ModernBertForSequenceClassification (modern-bert); "
        "JinaBertModel (jina-bert-v2: jina-embeddings-v2); Gemma3TextModel (gemma-embedding: EmbeddingGemma, "
        "with its sentence-transformers Dense modules unless --no-sentence-transformers-dense-modules). Norms, "
        "biases, positions and token types stay F32, as llama.cpp keeps them.",
    )
    p.add_argument("input", metavar="HF_DIR", help="the Hugging Face model folder")
    p.add_argument("output", metavar="OUT", help="the .gguf file to write")
    p.add_argument("--type", default="f16", metavar="T", help=f"weight type: {', '.join(OUT_TYPES)} (default f16)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--sentence-transformers-dense-modules", action=argparse.BooleanOptionalAction, default=True,
                   help="EmbeddingGemma: write its 2_Dense / 3_Dense projections (default: on, the vectors "
                   "sentence-transformers computes; off: the pooled hidden states, llama.cpp's default)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge_infer.convert import convert_hf

    out_type = args.type.lower()
    if out_type not in OUT_TYPES:
        raise InvalidRequest(f"--type {args.type}: not a type convert writes; use one of {', '.join(OUT_TYPES)}")
    out = Path(args.output).expanduser()
    if out.exists() and not out.is_dir() and not args.force:
        raise InvalidRequest(f"{out}: already exists (use --force to overwrite it)")
    t0 = time.perf_counter()
    convert_hf(Path(args.input).expanduser(), out, out_type, dense_modules=args.sentence_transformers_dense_modules)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {out_type.upper()}) in {time.perf_counter() - t0:.1f} s")
    return 0
