"""llama.cpp's quantized KV types against llama.cpp with the same type_k / type_v (flash
attention on) on qwen2.5-coder-0.5b, teacher-forced over 256 tokens of the GPL-3.

q8_0 meets the issue's bar against llama.cpp (mean KL <= 0.01, top-1 >= 95%). The 4- and 5-bit
types do not, and cannot on this model: each implementation's KV rounding moves its logits
far from exact math (q4_0: KL ~1.5 for both; qwen2.5's keys carry outlier dimensions even
after the Hadamard rotation both apply), and the two roundings of slightly different
activations land on different codes, so their KL to each other is about the sum of both
(measured: q4_0 0.20, q5_1 0.04, iq4_nl 0.17). What is checked for them is the property that
matters to a user: ours is as close to exact math (our f32 KV) as llama.cpp's own is, within
30% (measured ratios 0.95, 0.97, 1.18). The bar's scale is checked too: llama.cpp against
itself, the same file and KV type with the prompt fed token by token instead of in one batch
(other matrix kernels, so activations rounded otherwise), is itself far above KL 0.01 for these
types (measured: q4_0 0.059, q5_1 0.026, iq4_nl 0.116), while q8_0 stays below it (0.004).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_oracle import LlamaCpp, kl_rows

from edge_infer import LLM
from edge_infer.formats.weight_types import by_name

pytestmark = pytest.mark.slow

GPL3 = Path("/usr/share/common-licenses/GPL-3")
N_TOKENS = 256
NO_WORSE = 1.3  # KL(exact || ours) <= NO_WORSE * KL(exact || llama.cpp)


@pytest.fixture(scope="module")
def exact(qwen2_path: Path) -> tuple[list[int], np.ndarray]:
    """The token ids and our logits with an f32 pool: the KV without rounding."""
    with LLM(str(qwen2_path), kv_cache_dtype="f32", kv_cache_memory="64MiB") as llm:
        ids = llm.tokenizer.encode(GPL3.read_text()[: 12 * N_TOKENS], add_special=True)[:N_TOKENS]
        return ids, llm.prompt_logits(ids)


def _both(path: Path, ids: list[int], kv: str) -> tuple[np.ndarray, np.ndarray]:
    with LLM(str(path), kv_cache_dtype=kv, kv_cache_memory="64MiB") as llm:
        ours = llm.prompt_logits(ids)
    code = by_name(kv.upper()).id
    m = LlamaCpp(path, len(ids), type_k=code, type_v=code)
    try:
        return ours, m.logits(ids)
    finally:
        m.close()


def test_q8_0_kv_agrees_with_llama_cpp(qwen2_path: Path, exact: tuple[list[int], np.ndarray]) -> None:
    ids, _ = exact
    ours, theirs = _both(qwen2_path, ids, "q8_0")
    kl = kl_rows(theirs[1:], ours[1:])  # position 0 left out as in test_forward_agreement
    top1 = (theirs[1:].argmax(1) == ours[1:].argmax(1)).mean()
    assert kl.mean() <= 0.01, f"mean KL {kl.mean():.4f}"
    assert top1 >= 0.95, f"top-1 {top1:.3f}"


@pytest.mark.parametrize("kv", ["q4_0", "q5_1", "iq4_nl"])
def test_low_bit_kv_is_as_close_to_exact_math_as_llama_cpp(qwen2_path: Path, exact: tuple[list[int], np.ndarray],
                                                           kv: str) -> None:
    ids, ref = exact
    ours, theirs = _both(qwen2_path, ids, kv)
    ours_kl, theirs_kl = kl_rows(ref[1:], ours[1:]).mean(), kl_rows(ref[1:], theirs[1:]).mean()
    assert ours_kl <= NO_WORSE * theirs_kl, f"{kv}: KL to exact math {ours_kl:.4f}, llama.cpp's {theirs_kl:.4f}"


def test_llama_cpp_misses_the_bar_against_itself_below_8_bits(qwen2_path: Path,
                                                              exact: tuple[list[int], np.ndarray]) -> None:
    """Why the 4-bit types are held to exact math instead: llama.cpp decoding the same tokens
    one at a time disagrees with its own one-batch logits by more than the issue's KL bar."""
    ids, _ = exact
    code = by_name("Q4_0").id
    m = LlamaCpp(qwen2_path, len(ids), type_k=code, type_v=code)
    try:
        whole, one_by_one = m.logits(ids), m.logits(ids, batch=1)
    finally:
        m.close()
    assert kl_rows(whole[1:], one_by_one[1:]).mean() > 0.03
