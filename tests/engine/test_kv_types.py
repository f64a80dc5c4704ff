"""llama.cpp's quantized KV types end to end (smollm2, the smallest real model): the pool's
bytes per token are the types' block sizes; batching, prefix-cache hits and speculative
decoding give the same greedy tokens with every type as one sequence alone does; K and V can
differ; a bad type is a clear error. The agreement with llama.cpp on the same types is
tests/models/test_kv_agreement.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_infer import LLM, SamplingParams
from edge_infer.config import EngineConfig
from edge_infer.errors import InvalidRequest

BLOCK_BYTES = {"f16": 64, "f32": 128, "q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}
PREFIX = ("You are a careful assistant. Answer in one short sentence, and never repeat the question back to "
          "the user. ")  # longer than a 16-token block: its full blocks are cached and shared
PROMPTS = [PREFIX + p for p in ("The capital of France is", "def add(a, b):\n    return", "One, two, three, four,")]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("kv", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/q4_0"])
def test_a_kv_type_batches_shares_prefixes_and_speculates_as_one_sequence(smollm2_path: Path, kv: str) -> None:
    k, v = (kv.split("/") + [None])[:2]
    with LLM(str(smollm2_path), kv_cache_dtype=k, kv_cache_dtype_v=v, kv_cache_memory="16MiB", max_num_seqs=4,
             speculative={"method": "ngram", "k": 3}) as spec, \
            LLM(str(smollm2_path), kv_cache_dtype=k, kv_cache_dtype_v=v, kv_cache_memory="16MiB",
                max_num_seqs=4) as llm:
        cfg = llm.model_config
        per_token = cfg.n_layers * cfg.n_kv_heads * cfg.head_dim // 32 * (BLOCK_BYTES[k] + BLOCK_BYTES[v or k])
        assert llm.plan.kv_bytes_per_token == per_token
        assert llm.plan.kv_types == kv
        alone = [_greedy(llm, [p])[0] for p in PROMPTS]
        assert _greedy(llm, PROMPTS) == alone  # batched
        assert _greedy(llm, PROMPTS) == alone  # again: every prompt's full blocks hit the prefix cache
        assert llm.metrics()["prefix_cache_hit_rate"] > 0
        assert _greedy(spec, PROMPTS) == alone  # speculative decoding is lossless on the same pool type


def test_bad_kv_types_are_clear_errors(smollm2_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="kv_cache_dtype must be one of f16, f32, q8_0"):
        EngineConfig(model="m.gguf", kv_cache_dtype="q4_k")
    with pytest.raises(InvalidRequest, match="kv_cache_dtype_v must be one of"):
        EngineConfig(model="m.gguf", kv_cache_dtype_v="int4")


def test_a_head_size_off_the_kv_blocks_is_a_clear_error(tmp_path: Path) -> None:
    # head size 16 cannot hold 32-element blocks: named, not a ZeroDivisionError while sizing the pool
    from tiny_models import write_tiny_llama

    from edge_infer.errors import UnsupportedModelError

    path = write_tiny_llama(tmp_path / "tiny.gguf", d_model=64, n_heads=4)
    with pytest.raises(UnsupportedModelError, match="KV cache type q4_0 .* head size 16 is not a multiple"):
        LLM(str(path), kv_cache_dtype="f16", kv_cache_dtype_v="q4_0")
    with LLM(str(path), kv_cache_dtype="f32") as llm:  # the float types take any head size
        assert llm.generate(["hi"], SamplingParams(max_tokens=2, temperature=0.0))[0].outputs[0].token_ids
