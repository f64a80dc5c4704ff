"""Dense architectures beyond llama/qwen2/gemma3 whose features reach the CUDA kernels
(tests/support/arch_cases.py: olmo2's full-width QK norm and post-norms without pre-norms,
granite's multipliers), through the simulated CUDA backend: a
12-token prompt's logits (a replayed step, padded to 16) match the CPU backend's, the same
greedy token wherever the CPU's top two are apart. F32: relative L2 <= 1e-4. Granite in Q4_0
(the 4-bit matmul and embedding): <= 2e-2, as the CPU multiplies a Q4_0 output matrix by float
activations (its int8 path takes a Q8_0 output only) where CUDA quantizes them to int8.
Rope variants change only the tables the host computes (yarn's and phi3's attention factor
the cos/sin scale): the same kernel path as llama's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arch_cases import write
from cuda_sim import ON_CUDA

from edge_infer import LLM

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="runs in the CUDA simulator's own process, or on a GPU")

# (gemma2's window and softcaps: gemma3's engine test and the attention kernel's twin test)
CASES = [("olmo2", "F32"), ("granite", "Q4_0")]
REL = {"F32": 1e-4, "Q4_0": 2e-2}
SMALL = {"n_layers": 2, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "ffn": 64}
IDS = [1, 17, 29, 3, 44, 5, 60, 7, 81, 9, 100, 11]


def _logits(path: Path, device: str) -> tuple[np.ndarray, int]:
    with LLM(str(path), device=device, kv_cache_memory="1MiB", max_model_len=64) as llm:
        out = llm.prompt_logits(IDS)
        replays = llm.worker.engine.runner.backend.graph_replays if device == "cuda" else 0  # type: ignore[union-attr]
    return out, replays


@pytest.mark.parametrize(("name", "qtype"), CASES, ids=[f"{n}-{q}" for n, q in CASES])
def test_architecture_on_cuda_matches_the_cpu(name: str, qtype: str, tmp_path: Path) -> None:
    path = write(tmp_path, name, qtype, **SMALL)
    gpu, replays = _logits(path, "cuda")
    cpu, _ = _logits(path, "cpu")
    assert replays >= 1
    rel = float(np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu))
    assert rel <= REL[qtype], rel
    top2 = np.sort(cpu, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 10 * REL[qtype] * float(np.abs(cpu).max())
    assert np.array_equal(gpu.argmax(-1)[clear], cpu.argmax(-1)[clear])
