"""Who touches the KV blocks, checked from the source (ARCHITECTURE.md, "The scheduler owns
sequence state"): only the scheduler and engine/prefill.py call the block manager's mutating
methods or move a sequence's num_computed_tokens; and the side paths (scoring, embeddings, the
draft proposer, the warm-up) really go through Prefill."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import tiny_models

from edge_infer.config import EngineConfig
from edge_infer.engine.engine import LLMEngine
from edge_infer.engine.prefill import Prefill
from edge_infer.engine.sequence import Sequence
from edge_infer.errors import OutOfMemoryBudget
from edge_infer.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[2]
SOURCES = [REPO / d for d in ("edge_infer", "formats", "kernels_cpu", "kernels_cuda")]
MUTATORS = {"append_slots", "truncate", "free", "allocate", "fork", "cache_full_blocks", "shift"}
OWNERS = {"edge_infer/engine/scheduler.py", "edge_infer/engine/prefill.py", "edge_infer/engine/block_manager.py"}
# num_computed_tokens is also reset by the sequence itself (preemption) and read everywhere
COUNTER_OWNERS = OWNERS | {"edge_infer/engine/sequence.py"}


def _violations() -> list[str]:
    found = []
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in MUTATORS and rel not in OWNERS
                        and _receiver_is_block_manager(node.func.value)):
                    found.append(f"{rel}:{node.lineno} calls {node.func.attr}")
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                for t in targets:
                    if (isinstance(t, ast.Attribute) and t.attr == "num_computed_tokens"
                            and rel not in COUNTER_OWNERS):
                        found.append(f"{rel}:{node.lineno} assigns num_computed_tokens")
    return found


def _receiver_is_block_manager(value: ast.expr) -> bool:
    """`bm.x(...)`, `self.bm.x(...)`, `self.block_manager.x(...)`, `block_manager.x(...)`."""
    name = value.attr if isinstance(value, ast.Attribute) else value.id if isinstance(value, ast.Name) else ""
    return name in ("bm", "block_manager", "_bm")


def test_only_the_scheduler_and_prefill_touch_blocks() -> None:
    assert _violations() == []


def test_the_check_bites() -> None:
    src = "def f(bm, seq):\n    bm.append_slots(seq, 1)\n    seq.num_computed_tokens += 1\n"
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    assert calls and _receiver_is_block_manager(calls[0].func.value)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    path = tiny_models.write_tiny_llama(tmp_path_factory.mktemp("own") / "tiny.gguf")
    return LLMEngine(EngineConfig.from_options(str(path), max_num_batched_tokens=8, kv_cache_memory=2**20))


def test_score_embed_and_warmup_leave_the_pool_as_they_found_it(engine: LLMEngine) -> None:
    bm = engine.block_manager
    free = bm.num_free_blocks
    assert isinstance(engine.prefill, Prefill)
    ids = list(range(1, 30))  # 29 tokens: four chunks of the 8-token budget
    whole = engine.score(ids)
    assert whole.shape[0] == len(ids) and bm.num_free_blocks == free
    # scoring in chunks is the same as scoring at once (the rows the chunks wrote line up)
    for n in (1, 8, 9, 17):
        np.testing.assert_array_equal(engine.score(ids[:n]), whole[:n])
    engine.embed([ids, ids[:3], ids[:9]])
    assert bm.num_free_blocks == free


def test_a_full_pool_is_out_of_memory_and_frees_what_it_took(engine: LLMEngine) -> None:
    bm = engine.block_manager
    free = bm.num_free_blocks
    # a running request holds all but two blocks: a 300-token score needs more
    holder = Sequence("holder", [1] * (bm.block_size * (free - 2)), SamplingParams(max_tokens=1))
    assert engine.prefill.reserve(holder, holder.num_tokens)
    try:
        with pytest.raises(OutOfMemoryBudget, match="score again later"):
            engine.score([(i % 200) + 1 for i in range(300)])
        assert bm.num_free_blocks == 2
    finally:
        engine.prefill.release(holder)
    assert bm.num_free_blocks == free
