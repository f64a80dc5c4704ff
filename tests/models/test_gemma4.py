"""gemma4 against llama.cpp on tiny random-weight GGUFs in llama.cpp's layout
(tests/support/gemma_models.py), as test_hybrid_architectures.py does for the hybrids: relative
L2 <= 1e-3 and top-1 >= 99% in one prefill and one token a step, bit-identical batched with
another sequence and in chunks. The default file has every gemma4 feature on: sliding-window
layers with their own head dim / KV heads / RoPE, proportional RoPE (rope_freqs) on the full
layers, per-layer embeddings, the last 2 layers reusing the KV of the last full / sliding layer
with double-wide MLPs, V = K's raw projection on the full layers, per-layer output scales and a
final softcap the logits reach; "moe" is 26B-A4B's layout (routed experts beside the dense MLP).
Q8_0: mean KL <= 0.01. The last test checks the fixture itself in llama.cpp alone: each of
those features moves llama.cpp's logits well past the comparison's tolerance."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arch_compare import assert_matches, assert_quantized_kl, llama_cpp_logits, token_ids
from gemma_models import swa_pattern, write_gemma4
from gguf_edits import assert_chunk_and_batch_invariant, assert_feature_bites, edited, fill, rel, shuffle_rows

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.models import config_from_gguf

# name: write_gemma4's options
CASES: dict[str, dict[str, Any]] = {
    "dense": {},  # PLE, 2 KV-shared double-wide layers, K = V on full layers, layer scales
    "no-ple-no-shared": dict(ple=False, shared_kv=0),
    "separate-v": dict(k_eq_v=False),
    # 26B-A4B's layout. The seed keeps every routing decision clear: llama.cpp's f16 KV cache
    # moves router logits by ~1e-3, and with 576 top-2-of-4 choices most seeds have a 2nd/3rd
    # expert gap below that (seeds 0, 7, 9 flip one, 2e-2 apart); seed 41's smallest gap is 0.01
    "moe": dict(moe=True, ple=False, shared_kv=0, double_wide=False, seed=41),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("gemma4")


def _write(files: Path, name: str, qtype: str = "F32", **extra: Any) -> Path:
    tag = "".join(f"-{k}={v}" for k, v in extra.items())
    return write_gemma4(files / f"{name}-{qtype}{tag}.gguf", qtype, **CASES[name], **extra)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_llama_cpp(name: str, files: Path) -> None:
    path = _write(files, name)
    ids = token_ids()
    assert_matches(name, path, ids, llama_cpp_logits(path, ids))


def test_q8_0_kl(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_quantized_kl("gemma4 Q8_0", _write(files, "dense", "Q8_0"), monkeypatch)


def test_q4_k_kl(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every matrix input a whole number of 256-wide super-blocks
    wide = dict(d_model=256, n_heads=16, ffn=256, per_layer=256)
    assert_quantized_kl("gemma4 Q4_K", _write(files, "dense", "Q4_K", **wide), monkeypatch)


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_batch_and_chunk_invariance(name: str, files: Path) -> None:
    """The prefill's logits, bit for bit, in chunks and batched (each the KV-shared layers' source
    of its own sequence only)."""
    assert_chunk_and_batch_invariant(name, _write(files, name))








def _copy(values: np.ndarray) -> Callable[[np.ndarray], None]:
    def run(x: np.ndarray) -> None:
        x[...] = values

    return run




# what the writer's features are, as edits of the dense (or moe) file or writer options
FEATURES: dict[str, tuple[str, dict[str, Callable[[np.ndarray], None]], dict[str, Any]]] = {
    "per-layer token embeddings": ("dense", {"per_layer_token_embd.weight": shuffle_rows}, {}),
    "per-layer projection": ("dense", {"per_layer_model_proj.weight": fill(0.0)}, {}),
    "layer output scales": ("dense", {f"blk.{i}.layer_output_scale.weight": fill(1.0) for i in range(6)}, {}),
    "proportional rope": ("dense", {"rope_freqs.weight": fill(1.0)}, {}),
    "KV-shared sliding layer's q": ("dense", {"blk.4.attn_q.weight": fill(0.0)}, {}),
    "KV-shared full layer's q": ("dense", {"blk.5.attn_q.weight": fill(0.0)}, {}),
    "sliding window": ("dense", {}, dict(sliding_window=1000)),
    "softcap": ("dense", {}, dict(softcap=0.0)),
    "expert output scales": ("moe", {f"blk.{i}.ffn_down_exps.scale": fill(1.0) for i in range(6)}, {}),
    "router input scale": ("moe", {f"blk.{i}.ffn_gate_inp.scale": fill(1.0) for i in range(6)}, {}),
    "top-k": ("moe", {}, dict(experts=(4, 1, 64))),
}


@pytest.mark.parametrize("feature", list(FEATURES))
def test_fixture_feature_bites_in_llama_cpp(feature: str, files: Path) -> None:
    """llama.cpp alone: each of the writer's gemma4 features moves the logits (relative L2 >
    1e-2, ten times the comparison's tolerance); the default file's logits are finite, varied
    and reach the softcap."""
    name, edit, options = FEATURES[feature]
    original = _write(files, name)
    assert_feature_bites(original, edited(original, edit) if edit else _write(files, name, **options))


def test_fixture_v_is_k_without_attn_v(files: Path) -> None:
    """Without attn_v a full layer's V is its K's raw projection in llama.cpp: the file with
    separate V projections, each full layer's set to its K's, gives the dense file's logits
    exactly (the draws do not depend on k_eq_v); with its own V's, different ones."""
    from gguf import GGUFReader

    ids = token_ids()
    ref, separate = llama_cpp_logits(_write(files, "dense"), ids), _write(files, "separate-v")
    assert rel(llama_cpp_logits(separate, ids), ref) > 1e-2
    k = {t.name: np.array(t.data) for t in GGUFReader(str(separate)).tensors if t.name.endswith("attn_k.weight")}
    full_kv = [i for i, s in enumerate(swa_pattern(6, 2)[:4]) if not s]
    v_is_k = {f"blk.{i}.attn_v.weight": _copy(k[f"blk.{i}.attn_k.weight"]) for i in full_kv}
    np.testing.assert_array_equal(llama_cpp_logits(edited(separate, v_is_k), ids), ref)


@pytest.mark.parametrize("key, value, says", [
    ("attention.sliding_window_pattern", 6, "sliding_window_pattern' as per-layer flags"),
    ("attention.head_count_kv", [1, 2, 2, 2, 2, 1], "head_count_kv varies within the full or sliding-window layers"),
    ("attention.value_length_swa", 8, "key and value lengths equal"),
    ("attention.shared_kv_layers", 5, "shared_kv_layers = 5 of 6 layers"),
])
def test_malformed_metadata_is_refused_by_name(key: str, value: object, says: str, files: Path) -> None:
    """A gemma4 file whose metadata llama.cpp would refuse gets one error naming the key."""
    with GGUFFile(_write(files, "dense")) as f:
        f.metadata[f"gemma4.{key}"] = value
        with pytest.raises(UnsupportedModelError, match=re.escape(says)):
            config_from_gguf(f)
