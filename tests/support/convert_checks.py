"""Checks the converter tests share: a file's metadata as plain values, and `refused` (a
conversion that raises one clear line naming the problem and leaves nothing behind)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from edge_infer.convert import convert_hf
from edge_infer.errors import ConversionError, EdgeInferError


def fields(path: Path) -> dict[str, object]:
    """The file's keys (without GGUF.*) in order, with their values."""
    r = GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def tensors(path: Path) -> list[tuple[str, str, list[int]]]:
    """(name, type, ggml shape) of each tensor, in file order."""
    return [(t.name, t.tensor_type.name, [int(n) for n in t.shape]) for t in GGUFReader(str(path)).tensors]


def refused(src: Path, out: Path, *needles: str, kind: type[EdgeInferError] = ConversionError,
            out_type: str = "f16") -> None:
    """convert_hf(src, out) raises `kind` naming every needle, and out's folder is as it was."""
    before = sorted(os.listdir(out.parent)) if out.parent.is_dir() else None
    with pytest.raises(kind) as e:
        convert_hf(src, out, out_type)
    msg = str(e.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, msg
    after = sorted(os.listdir(out.parent)) if out.parent.is_dir() else None
    assert after == before  # neither the output nor a temporary file


Embedded = dict[str, tuple[list[int], np.ndarray]]


def both_engines(path: Path, sentences: tuple[str, ...] | list[str], n_ctx: int = 64) -> tuple[Embedded, Embedded]:
    """(llama.cpp's, edge-infer's) tokens and unit embeddings of each sentence on the file at
    path: llama.cpp first, then ours (their thread pools spin-wait on each other's cores)."""
    from llama_bert import LlamaBert

    from edge_infer import LLM

    llm = LlamaBert(path, n_ctx)
    try:
        theirs = {s: (llm.tokens(s), llm.embed(s)) for s in sentences}
    finally:
        llm.close()
    with LLM(str(path), n_threads=1) as m:
        embs = m.embed(list(sentences))
        ours = {s: (m.tokenizer.encode(s, add_special=True), np.asarray(embs[i], np.float64))
                for i, s in enumerate(sentences)}
    return theirs, ours


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
