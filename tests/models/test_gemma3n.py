"""gemma3n against llama.cpp on tiny random-weight GGUFs in llama.cpp's layout
(tests/support/gemma3n_models.py), as test_gemma4.py does for gemma4: relative L2 <= 1e-3 and
top-1 >= 99% in one prefill and one token a step, bit-identical batched with another sequence
and in chunks. Every file has gemma3n's hard-coded parts: 4 AltUp streams, LAuReL, 256-wide
per-layer inputs, activation sparsity on layers < 10, attention scale 1, softcap 30. "short" is
4 layers alternating sliding / full, all sparse; "kv-shared" 22, whose layers 20 and 21 read the
K/V of layers 18 (sliding) and 19 (full); "bare" 12 with only the keys llama.cpp reads (no
sliding_window_pattern: llama.cpp's period of 5), its layers 10 and 11 dense; "untied" has an
output.weight. "kv-shared" is compared on 64 tokens (8 sliding windows), the rest on 96.
Q8_0: mean KL <= 0.01. The last tests check the fixture in llama.cpp alone: each
feature moves llama.cpp's logits well past the comparison's tolerance."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arch_compare import assert_matches, assert_quantized_kl, llama_cpp_logits, token_ids
from gemma3n_models import write_gemma3n
from gguf_edits import assert_chunk_and_batch_invariant, assert_feature_bites, edited, fill, rel, shuffle_rows

# name: write_gemma3n's options
CASES: dict[str, dict[str, Any]] = {
    "short": {},
    "kv-shared": dict(n_layers=22),
    "bare": dict(n_layers=12, swa_period=None, converter_keys=False),
    "untied": dict(tied=False),
}
# prompt lengths other than arch_compare's 96: 22 layers a token a step take ~2 s for 96
N_TOKENS = {"kv-shared": 64}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("gemma3n")


def _write(files: Path, name: str, qtype: str = "F32", **extra: Any) -> Path:
    tag = "".join(f"-{k}={v}" for k, v in extra.items())
    path = files / f"{name}-{qtype}{tag}.gguf"
    return path if path.exists() else write_gemma3n(path, qtype, **{**CASES[name], **extra})


@pytest.mark.parametrize("name", list(CASES))
def test_matches_llama_cpp(name: str, files: Path) -> None:
    path = _write(files, name)
    ids = token_ids()[: N_TOKENS.get(name)]
    assert_matches(name, path, ids, llama_cpp_logits(path, ids))


def test_q8_0_kl(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_quantized_kl("gemma3n Q8_0", _write(files, "short", "Q8_0"), monkeypatch)


def test_q4_k_kl(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every quantized matrix's input a whole number of 256-wide super-blocks
    assert_quantized_kl("gemma3n Q4_K", _write(files, "short", "Q4_K", d_model=256, n_heads=8, ffn=256), monkeypatch)


@pytest.mark.parametrize("name", ["short", "kv-shared"])
def test_batch_and_chunk_invariance(name: str, files: Path) -> None:
    """The prefill's logits, bit for bit, in chunks and batched (each the KV-shared layers' source
    of its own sequence only)."""
    assert_chunk_and_batch_invariant(name, _write(files, name))










def _reverse_slices(x: np.ndarray) -> None:
    """altup_proj / altup_unembd_proj [3, E, E]: stream 1's map to stream 3 and back."""
    x[...] = x[::-1].copy()


def _add_row(x: np.ndarray) -> None:
    """The same vector added to every row: each token's gate values shift by one constant."""
    x += np.random.default_rng(1).normal(0.0, 0.2, (1, x.shape[1])).astype(x.dtype)


def _each(n: int, suffix: str, edit: Callable[[np.ndarray], None]) -> dict[str, Callable[[np.ndarray], None]]:
    return {f"blk.{i}.{suffix}": edit for i in range(n)}


# what the writer's features are, as edits of a file or writer options
FEATURES: dict[str, tuple[str, dict[str, Callable[[np.ndarray], None]], dict[str, Any]]] = {
    "altup prediction coefficients": ("short", _each(4, "altup_predict_coef.weight", fill(0.0)), {}),
    "altup correction coefficients": ("short", _each(4, "altup_correct_coef.weight", fill(0.0)), {}),
    "altup correct scale": ("short", _each(4, "altup_correct_scale.weight", fill(1.0)), {}),
    "altup projections": ("short", {"altup_proj.weight": _reverse_slices}, {}),
    "altup unembedding": ("short", {"altup_unembd_proj.weight": _reverse_slices}, {}),
    "laurel": ("short", _each(4, "laurel_r.weight", fill(0.0)), {}),
    "per-layer token embeddings": ("short", {"per_layer_token_embd.weight": shuffle_rows}, {}),
    "per-layer projection": ("short", {"per_layer_model_proj.weight": fill(0.0)}, {}),
    "sliding window": ("short", {}, dict(sliding_window=1000)),
    "sliding window pattern": ("short", {}, dict(swa_period=4)),
    "dense layers' gate": ("bare", {"blk.11.ffn_gate.weight": _add_row}, {}),
    "KV-shared sliding layer's q": ("kv-shared", {"blk.20.attn_q.weight": fill(0.0)}, {}),
    "KV-shared full layer's q": ("kv-shared", {"blk.21.attn_q.weight": fill(0.0)}, {}),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_fixture_feature_bites_in_llama_cpp(feature: str, files: Path) -> None:
    """llama.cpp alone: each of the writer's gemma3n features moves the logits (relative L2 >
    1e-2, ten times the comparison's tolerance); the file's logits are finite, varied and reach
    the softcap."""
    name, edit, options = FEATURES[feature]
    original = _write(files, name)
    assert_feature_bites(original, edited(original, edit) if edit else _write(files, name, **options))


def test_fixture_sparsity_in_llama_cpp(files: Path) -> None:
    """Activation sparsity (relu(gate - mean - 1.645 std)) ignores a per-token shift of all the
    gate values: adding one vector to every row of a sparse layer's ffn_gate (< 10) leaves
    llama.cpp's logits as they were, to rounding (~1e-5: its f16 GELU table), far within the
    comparison's tolerance; on a dense layer (>= 10) it moves them by ~0.1 (the test above)."""
    ids = token_ids()
    path = _write(files, "bare")
    ref = llama_cpp_logits(path, ids)
    for layer in (0, 9):
        shifted = edited(path, {f"blk.{layer}.ffn_gate.weight": _add_row}, f"shift{layer}")
        assert rel(llama_cpp_logits(shifted, ids), ref) < 1e-3, f"layer {layer}"


def test_fixture_kv_sharing_in_llama_cpp(files: Path) -> None:
    """Layers 20 and 21 of the 22-layer file attend over layers 18's and 19's K/V in llama.cpp:
    their own attn_k, attn_v and attn_k_norm (loaded, as llama.cpp requires) change nothing."""
    ids = token_ids()
    path = _write(files, "kv-shared")
    own_kv = {f"blk.{i}.{t}.weight": fill(0.5) for i in (20, 21) for t in ("attn_k", "attn_v", "attn_k_norm")}
    np.testing.assert_array_equal(llama_cpp_logits(edited(path, own_kv), ids), llama_cpp_logits(path, ids))


def test_fixture_default_pattern_in_llama_cpp(files: Path) -> None:
    """Without sliding_window_pattern llama.cpp slides on 4 of every 5 layers; the keys it does
    not read change nothing: the bare file's logits are those of the same weights with the
    converter's keys and an explicit period-5 pattern."""
    ids = token_ids()
    explicit = _write(files, "bare", swa_period=5, converter_keys=True)
    np.testing.assert_array_equal(llama_cpp_logits(explicit, ids), llama_cpp_logits(_write(files, "bare"), ids))
