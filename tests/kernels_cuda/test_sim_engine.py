"""Tiny synthetic models through the whole engine on the simulated CUDA backend give the greedy
tokens of the CPU backend: llama (Q8_0: the dp4a path) with batching and prefix-cache hits,
qwen2 (F32, biases, NEOX RoPE, tied embeddings) with n-gram speculation, gemma3 (QK-norm,
post-norms, GeGLU, sliding windows)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cuda_sim import ON_CUDA
from tiny_models import write_tiny_gemma3, write_tiny_llama, write_tiny_qwen2

from edge_infer import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="runs in the CUDA simulator's own process, or on a GPU")

SHAPE = {"n_layers": 1, "d_model": 32, "n_heads": 2, "n_kv_heads": 1, "ffn": 64}
SHARED = "the cat sat on the mat and the dog sat on the log; "  # a prefix two requests share


def _greedy(path: Path, device: str, prompts: list[str], n: int, **opts: object) -> list[list[int]]:
    with LLM(str(path), device=device, kv_cache_memory="2MiB", max_model_len=128, **opts) as llm:
        assert llm.plan.device == device
        outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        return [list(o.outputs[0].token_ids) for o in outs]


def test_llama_q8_0_with_batching_and_prefix_hits(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path, qtype="Q8_0", **SHAPE)
    prompts = [SHARED + "then", SHARED + "and so", "hello world"]
    cpu = _greedy(path, "cpu", prompts, 6)
    with LLM(str(path), device="cuda", kv_cache_memory="2MiB", max_model_len=128) as llm:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        first = llm.generate(prompts[:1], params)  # fills the prefix cache
        rest = llm.generate(prompts, params)  # batched, two of them hit the cached prefix
        assert llm.metrics()["prefix_cache_hit_rate"] > 0
    assert list(first[0].outputs[0].token_ids) == cpu[0]
    assert [list(o.outputs[0].token_ids) for o in rest] == cpu


def test_qwen2_f32_with_ngram_speculation(tmp_path: Path) -> None:
    path = write_tiny_qwen2(tmp_path, **SHAPE)
    prompts = ["a b c a b c a b c a b", "xyz xyz xyz"]
    cpu = _greedy(path, "cpu", prompts, 6)
    assert _greedy(path, "cuda", prompts, 6, speculative={"method": "ngram", "k": 3}) == cpu


def test_gemma3_sliding_window(tmp_path: Path) -> None:
    path = write_tiny_gemma3(tmp_path, n_layers=2, d_model=32, n_heads=2, n_kv_heads=1, ffn=64, head_dim=16,
                             sliding_window=4)
    prompts = ["the quick brown fox jumps"]
    assert _greedy(path, "cuda", prompts, 6) == _greedy(path, "cpu", prompts, 6)
