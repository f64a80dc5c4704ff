"""Edited copies of small GGUF files and the measures the llama.cpp-side fixture tests share
(each feature of a tiny writer must move llama.cpp's logits), and the bit-for-bit chunk and
batch invariance check of an architecture's file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from arch_compare import batched, llama_cpp_logits, ours, token_ids

Edit = Callable[[np.ndarray], None]


def edited(src: Path, edits: dict[str, Edit], tag: str = "edited") -> Path:
    """A copy of src (named with `tag`) with some F32 tensors changed in place, by name."""
    from gguf import GGUFReader

    dst = src.with_name(f"{src.stem}-{tag}.gguf")
    shutil.copy(src, dst)
    r = GGUFReader(str(dst), "r+")
    done = set()
    for t in r.tensors:
        if t.name in edits:
            edits[t.name](t.data)
            done.add(t.name)
    r.data.flush()
    del r
    assert done == set(edits), f"not in the file: {set(edits) - done}"
    return dst


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Relative L2 distance of a from b."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def fill(value: float) -> Edit:
    def run(x: np.ndarray) -> None:
        x[...] = value

    return run


def shuffle_rows(x: np.ndarray) -> None:
    x[...] = x[np.random.default_rng(0).permutation(len(x))]


def assert_chunk_and_batch_invariant(name: str, path: Path) -> None:
    """The prefill's logits, bit for bit, in chunks (a boundary inside and across a small
    sliding window) and batched with a longer and a shorter other sequence."""
    ids = token_ids()
    prefill = ours(path, ids)
    for step in (3, 8, 40):
        np.testing.assert_array_equal(ours(path, ids, step_tokens=step), prefill, err_msg=f"{name}: chunks of {step}")
    for other in (token_ids(2), token_ids(3)[:5]):
        np.testing.assert_array_equal(batched(path, ids, other), prefill,
                                      err_msg=f"{name}: batched with a sequence of {len(other)}")


def assert_feature_bites(original: Path, changed: Path) -> None:
    """llama.cpp alone: the file's logits are finite, varied and reach a softcap of 30, and the
    changed file's (a feature edited or written otherwise) move by more than 1e-2 relative L2,
    ten times the comparison's tolerance."""
    ids = token_ids()
    ref = llama_cpp_logits(original, ids)
    assert np.isfinite(ref).all() and np.abs(ref).max() > 25.0 and len(set(ref.argmax(-1).tolist())) > 10
    assert rel(llama_cpp_logits(changed, ids), ref) > 1e-2
