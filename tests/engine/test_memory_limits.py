"""Memory before loading: a model that cannot fit in the available memory is refused with both
sizes named, before anything loads; the default KV pool is sized for the machine (a quarter
of what is available, and never more than the allowed sequences can fill)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from edge_infer import LLM
from edge_infer.errors import OutOfMemoryBudget


def _fake_available(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=max(available, real.total),
                                                                          available=available))


def test_a_model_that_cannot_fit_is_refused_naming_sizes(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_available(monkeypatch, 120 * 2**20)
    with pytest.raises(OutOfMemoryBudget, match=r"needs about 0\.\d\d GiB \(0\.\d\d GiB of weights.*only 0\.12 GiB is available"):
        LLM(str(smollm2_path), n_threads=1)
    _fake_available(monkeypatch, 2 * 2**30)
    with pytest.raises(OutOfMemoryBudget, match=r"2\.00 GiB of KV cache"):
        LLM(str(smollm2_path), n_threads=1, kv_cache_memory="2GiB")


def test_default_pool_fits_a_small_machine(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_available(monkeypatch, int(3.5 * 2**30))  # a 4 GB board after the OS
    with LLM(str(smollm2_path), n_threads=1) as llm:
        assert 0 < llm.plan.kv_cache_bytes <= int(3.5 * 2**30) // 4
    with LLM(str(smollm2_path), n_threads=1, max_num_seqs=1, max_model_len=512) as one:
        # one sequence of 512 tokens: the pool is what it can fill, not a quarter of the machine
        assert one.plan.kv_capacity_tokens <= 512 + one.plan.block_size
