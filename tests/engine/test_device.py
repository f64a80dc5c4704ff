"""Choosing the backend: device="cpu" | "cuda" | "auto". Without a GPU, "cuda" is a clear error
naming why and "auto" runs on the CPU exactly as before; what the CUDA kernels lack (experts,
a q8_0 KV cache, wide heads) is named. The simulated CUDA runs are in tests/kernels_cuda."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from cuda_sim import ON_CUDA

from edge_infer import LLM
from edge_infer.config import EngineConfig
from edge_infer.engine.device import cuda_lacks, cuda_missing, make_backend
from edge_infer.errors import EdgeInferError, UnsupportedModelError

pytestmark = pytest.mark.skipif(ON_CUDA, reason="the device choice on a machine without CUDA")


def _cfg(**kw: object) -> SimpleNamespace:
    return SimpleNamespace(**{"arch": "llama", "n_experts": 0, "head_dim": 64, "recurrent": False, "activation": "silu",
                              "attn_out_bias": False, "attn_sinks": False, "per_layer_input": 0, "v_norm": False,
                              "kv_shared_from": 0, "head_dim_swa": 0, "layer_ffn_dims": (), **kw})


def test_without_a_gpu_cuda_is_refused_and_auto_is_the_cpu(tiny_llama_path: Path) -> None:
    missing = cuda_missing()
    assert missing is not None  # this machine has no CUDA device
    with pytest.raises(EdgeInferError, match=r"device='cuda': .*(no CUDA device|not installed|not usable)"):
        LLM(str(tiny_llama_path), device="cuda", kv_cache_memory="2MiB")
    with LLM(str(tiny_llama_path), device="auto", kv_cache_memory="2MiB") as llm:
        assert llm.plan.device == "cpu"


def test_what_cuda_lacks_is_named() -> None:
    config = EngineConfig(model="m.gguf")
    assert cuda_lacks(config, _cfg()) is None
    assert "route_experts" in (cuda_lacks(config, _cfg(arch="qwen3moe", n_experts=8)) or "")
    assert "q8_0" in (cuda_lacks(EngineConfig(model="m.gguf", kv_cache_dtype="q8_0"), _cfg()) or "")
    assert "head_dim 512" in (cuda_lacks(config, _cfg(head_dim=512)) or "")
    assert "lfm2: the CUDA backend has no recurrent-layer kernels" in (cuda_lacks(config, _cfg(arch="lfm2", recurrent=True)) or "")
    assert "gemma4: the CUDA backend has no per-layer embedding" in (cuda_lacks(config, _cfg(arch="gemma4", per_layer_input=256)) or "")
    assert "apertus: the CUDA backend has no xielu" in (cuda_lacks(config, _cfg(arch="apertus", activation="xielu")) or "")


def test_auto_falls_back_to_the_cpu_saying_why(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import edge_infer.engine.device as device

    monkeypatch.setattr(device, "cuda_missing", lambda: None)  # as if a GPU were there
    moe = _cfg(arch="qwen3moe", n_experts=8)
    with caplog.at_level(logging.WARNING, logger="edge_infer.engine"):
        backend = make_backend(EngineConfig(model="m.gguf", n_threads=1), moe)  # type: ignore[arg-type]
    assert backend.name == "cpu"
    assert "running on the CPU" in caplog.text and "mixture-of-experts" in caplog.text
    with pytest.raises(UnsupportedModelError, match="device='cuda': qwen3moe: .*route_experts"):
        make_backend(EngineConfig(model="m.gguf", device="cuda"), moe)  # type: ignore[arg-type]


def test_enforce_eager_is_validated_and_reaches_the_cli() -> None:
    import argparse

    from edge_infer.cli.args import add_model_args, engine_options
    from edge_infer.errors import InvalidRequest

    assert EngineConfig(model="m.gguf", enforce_eager=True).enforce_eager
    with pytest.raises(InvalidRequest, match="enforce_eager must be True or False, got 'yes'"):
        EngineConfig(model="m.gguf", enforce_eager="yes")  # type: ignore[arg-type]
    p = argparse.ArgumentParser()
    add_model_args(p)
    assert engine_options(p.parse_args(["--enforce-eager"])).get("enforce_eager") is True
    assert "enforce_eager" not in engine_options(p.parse_args([]))
