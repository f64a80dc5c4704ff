"""The llama.cpp comparison the architecture tests share: the same token ids through llama.cpp
and through edge-infer (whole prompt, a few tokens a step, batched with another sequence), and
the agreement measures (relative L2 of the logits, top-1 where llama.cpp's margin is clear)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_oracle import LlamaCpp, kl_rows

from edge_infer import LLM, SamplingParams
from edge_infer.engine.scheduler import ScheduledChunk
from edge_infer.engine.sequence import Sequence

N_IDS = 96
REL_L2, TOP1, MARGIN, MEAN_KL = 1e-3, 0.99, 1e-2, 0.01


def compare(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(relative L2 error, top-1 agreement where ref's top-2 margin exceeds MARGIN)."""
    rel = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
    top2 = np.sort(ref, axis=-1)[:, -2:]
    keep = top2[:, 1] - top2[:, 0] > MARGIN
    agree = float(np.mean(ours[keep].argmax(-1) == ref[keep].argmax(-1))) if keep.any() else 1.0
    return rel, agree


def token_ids(seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, N_IDS)]


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    m = LlamaCpp(path, len(ids))
    try:
        return m.logits(ids)
    finally:
        m.close()


def ours(path: Path, ids: list[int], step_tokens: int = 256) -> np.ndarray:
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB", max_num_batched_tokens=step_tokens) as llm:
        return llm.prompt_logits(ids)


def batched(path: Path, ids: list[int], other: list[int]) -> np.ndarray:
    """ids' logits computed in one step together with another sequence's prefill."""

    def run(e: Any) -> np.ndarray:
        seqs = [Sequence("__a__", ids, SamplingParams(max_tokens=1)), Sequence("__b__", other, SamplingParams(max_tokens=1))]
        try:
            for s in seqs:
                assert e.block_manager.append_slots(s, len(s.prompt_token_ids))
            chunks = [ScheduledChunk(s, list(s.prompt_token_ids), list(range(len(s.prompt_token_ids)))) for s in reversed(seqs)]
            return e.runner.run(chunks)[len(other):]
        finally:
            for s in seqs:
                e.block_manager.free(s)

    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
        return llm.worker.call(run)


def assert_matches(name: str, path: Path, ids: list[int], ref: np.ndarray) -> np.ndarray:
    """Our logits of ids within REL_L2 / TOP1 of llama.cpp's (ref) in one prefill, one token a
    step, and bit-identical batched with another sequence; the prefill's logits."""
    prefill = ours(path, ids)
    for what, got in (("prefill", prefill), ("one token at a time", ours(path, ids, step_tokens=1))):
        rel, agree = compare(got, ref)
        assert rel <= REL_L2 and agree >= TOP1, f"{name} {what}: relative L2 {rel:.2e}, top-1 {agree:.3f}"
    together = batched(path, ids, token_ids(1)[:40])
    np.testing.assert_array_equal(together, prefill, err_msg=f"{name}: batched with another sequence")
    return prefill


def assert_quantized_kl(name: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mean KL vs llama.cpp <= MEAN_KL; where llama.cpp is the further of the two from exact math
    (the file's dequantized weights in float32 with float activations: our float path), ours
    within MEAN_KL of exact math instead (llama.cpp quantizes activations per 256 for the
    K-quants, we per 32)."""
    from edge_infer.kernels_cpu.backend import CpuBackend

    ids = token_ids()
    ref, got = llama_cpp_logits(path, ids), ours(path, ids)
    kl = float(kl_rows(ref, got).mean())
    if kl <= MEAN_KL:
        return
    monkeypatch.setattr(CpuBackend, "prepare_weights", lambda self, f, roles: [m for _, m in roles])
    exact = ours(path, ids)
    ours_kl, theirs_kl = float(kl_rows(exact, got).mean()), float(kl_rows(exact, ref).mean())
    assert ours_kl <= MEAN_KL and ours_kl < theirs_kl, (
        f"{name}: mean KL {kl:.4f} vs llama.cpp; from exact math ours {ours_kl:.4f}, llama.cpp's {theirs_kl:.4f}"
    )
