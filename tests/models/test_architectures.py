"""Every dense architecture against llama.cpp on the same tiny random-weight GGUF (written in
llama.cpp's layout by tests/support/arch_models.py) and the same token ids: relative L2 error
of the logits <= 1e-3 and top-1 agreement >= 99% where llama.cpp's top-2 margin exceeds 1e-2,
in one prefill, one token at a time, and batched with another sequence. The metadata makes
each feature bite (softcaps small, windows shorter than the sequence, multipliers far from 1,
rope factors large), and each feature switched off in our config makes the comparison fail.
Quantized to Q8_0 and Q4_K (widths multiples of 256), mean KL <= 0.01. The mixture-of-experts
architectures route each token to several experts with distinct weights; choosing one expert
fewer, or normalising the weights the other way, fails the comparison."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from arch_cases import CASES, write
from arch_compare import (
    REL_L2,
    TOP1,
    assert_matches,
    assert_quantized_kl,
    compare,
    llama_cpp_logits,
    ours,
    token_ids,
)
from arch_models import write_arch_model

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models import ARCHITECTURES, config_from_gguf
from edge_infer.models.weights import load_weights


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("archs")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_llama_cpp(name: str, files: Path) -> None:
    path = write(files, name)
    ids = token_ids()
    assert_matches(name, path, ids, llama_cpp_logits(path, ids))


ABLATIONS = [(name, feature) for name, case in CASES.items() for feature in case[3]]


@pytest.mark.parametrize(("name", "feature"), ABLATIONS, ids=[f"{n}-{f}" for n, f in ABLATIONS])
def test_feature_off_disagrees(name: str, feature: str, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above cannot pass without the feature: switched off, it fails."""
    arch, _, _, ablations = CASES[name]
    path = write(files, name)
    ids = token_ids()
    ref = llama_cpp_logits(path, ids)
    module = ARCHITECTURES[arch]
    real = module.config_from_gguf
    monkeypatch.setattr(module, "config_from_gguf", lambda f: dataclasses.replace(real(f), **ablations[feature]))
    rel, agree = compare(ours(path, ids), ref)
    assert rel > REL_L2 or agree < TOP1, f"{name} without {feature}: still relative L2 {rel:.2e}, top-1 {agree:.3f}"


QUANT = [(name, q) for name in CASES for q in ("Q8_0", "Q4_K")]


@pytest.mark.parametrize(("name", "qtype"), QUANT, ids=[f"{n}-{q}" for n, q in QUANT])
def test_quantized_kl(name: str, qtype: str, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """arch_compare.assert_quantized_kl (phi3 with long rope factors measured KL 0.011 for
    llama.cpp, 0.006 for ours, from exact math)."""
    assert_quantized_kl(f"{name} {qtype}", write(files, name, qtype), monkeypatch)


def _load(path: Path) -> None:
    f = GGUFFile(path)
    load_weights(f, config_from_gguf(f), CpuBackend(1))


def test_unknown_rope_scaling_is_refused_by_name(files: Path) -> None:
    path = write_arch_model(files / "llama-longrope.gguf", "llama", meta={"llama.rope.scaling.type": "longrope-x"})
    with pytest.raises(UnsupportedModelError, match=r"llama\.rope\.scaling\.type = 'longrope-x'.*supported: none, linear, yarn"):
        _load(path)


def test_unused_tensor_is_refused_by_name(files: Path) -> None:
    """A tensor no code reads (here an attention-output bias) is an error, not silently dropped."""
    path = write_arch_model(files / "llama-extra.gguf", "llama",
                            factors={"blk.0.attn_output.bias": np.zeros(64, np.float32)})
    with pytest.raises(UnsupportedModelError, match=r"'blk\.0\.attn_output\.bias' not used by edge-infer's llama model"):
        _load(path)


def test_missing_tensor_and_unknown_architecture(files: Path) -> None:
    path = write_arch_model(files / "gemma2-as-olmo2.gguf", "gemma2")
    f = GGUFFile(path)
    cfg = dataclasses.replace(config_from_gguf(f), qk_norm_full=True)  # asks for olmo2's QK norms
    with pytest.raises(UnsupportedModelError, match=r"missing tensor 'blk\.0\.attn_q_norm\.weight'"):
        load_weights(f, cfg, CpuBackend(1))
    other = write_arch_model(files / "mamba.gguf", "mamba")
    with pytest.raises(UnsupportedModelError, match=r"architecture 'mamba' is not supported \(supported: apertus, ernie4_5, ernie4_5-moe, exaone4, falcon-h1"):
        config_from_gguf(GGUFFile(other))


def test_bad_expert_counts_are_refused_by_name(files: Path) -> None:
    path = write_arch_model(files / "qwen3moe-k9.gguf", "qwen3moe", experts=(8, 9, 32))
    with pytest.raises(UnsupportedModelError, match=r"qwen3moe: 8 experts need 1\.\.8 used per token \(got 9\)"):
        _load(path)
    f = GGUFFile(write_arch_model(files / "qwen3moe-noexp.gguf", "qwen3moe"))  # no expert metadata
    with pytest.raises(UnsupportedModelError, match=r"missing metadata key 'qwen3moe\.expert_count'"):
        config_from_gguf(f)


def test_variants_edge_infer_does_not_run_are_refused_by_name(files: Path) -> None:
    def refused(path: Path, edit: dict[str, object], match: str, drop: str = "") -> None:
        f = GGUFFile(path)
        f.metadata.update(edit)
        if drop:
            del f.tensors[drop]
        with pytest.raises(UnsupportedModelError, match=match):
            config_from_gguf(f)

    moe = write(files, "ernie4_5-moe")
    refused(moe, {"ernie4_5-moe.interleave_moe_layer_step": 2}, r"interleave_moe_layer_step = 2 is not supported")
    refused(moe, {}, r"experts without a gate stack \(blk\.1\.ffn_gate_exps\.weight\)", "blk.1.ffn_gate_exps.weight")
    refused(write(files, "ernie4_5"), {"ernie4_5.rope.dimension_sections": [16, 8, 8, 0]}, "PaddleOCR-VL's M-RoPE")
    refused(write(files, "granitemoe"), {}, r"granitemoe experts without a gate stack", "blk.0.ffn_gate_exps.weight")
    refused(write(files, "glm4"), {"glm4.rope.dimension_sections": [8, 12, 12, 0]}, "M-RoPE sections")
    refused(write(files, "exaone4"), {"exaone4.attention.key_length": 8}, r"heads x head_dim equal to the width 64")


def test_gpt_oss_mxfp4_experts_from_llama_quantize(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss as it ships: llama.cpp's MXFP4_MOE quantization (MXFP4 experts, Q8_0 attention,
    F32 biases, sinks and router), within mean KL 0.01 of llama.cpp on the same file."""
    from quant_helpers import llama_quantize

    src = write(files, "gpt-oss", "F32", d_model=256, ffn=512, n_heads=16, experts=(8, 2, 256), output_std=0.25)
    dst = llama_quantize(src, files / "gpt-oss-MXFP4_MOE.gguf", 38)  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    types = {name: t.type.name for name, t in GGUFFile(dst).tensors.items()}
    assert types["blk.0.ffn_up_exps.weight"] == "MXFP4" and types["blk.0.attn_q.weight"] == "Q8_0"
    assert_quantized_kl("gpt-oss MXFP4_MOE", dst, monkeypatch)
