"""The hybrid recurrent architectures against llama.cpp on tiny random-weight GGUFs written in
llama.cpp's layout (tests/support/hybrid_models.py), as test_architectures.py does for the
transformers: relative L2 <= 1e-3 and top-1 >= 99% in one prefill, one token a step, in chunks
of several sizes (bit-identical to the prefill: a chunk resumes from the state the last one
left), and batched with another sequence (bit-identical). Each part of the recurrent block
switched off fails the comparison: LFM2's convolution state, its taps' order, its c gate;
Mamba2's scan state, its memory past 64 tokens (the state forgotten at token 16 changes the
logits from token 80 on), its D skip, its gate, granite's multipliers. Quantized to Q8_0 and
Q4_K (the convolution's taps and the SSM's vectors stay float32, as llama-quantize leaves
them): mean KL <= 0.01."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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
from hybrid_models import (
    NEMOTRON_LAYERS,
    write_falcon_h1,
    write_granitehybrid,
    write_lfm2,
    write_nemotron_h,
    write_qwen35,
)

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models import ARCHITECTURES, config_from_gguf
from edge_infer.models.weights import load_weights

# name: (writer, the options that make the case's features bite, {feature: config change that
# switches it off})
CASES: dict[str, tuple[Any, dict[str, Any], dict[str, dict[str, Any]]]] = {
    "lfm2": (write_lfm2, {}, {}),
    "lfm2-swa": (write_lfm2, dict(sliding_window=8), {"sliding window": {"swa_layers": (False,) * 6}}),
    # the first 2 layers dense, then experts chosen by sigmoid + a selection bias
    "lfm2moe": (write_lfm2, dict(experts=(8, 2, 32)), {
        "sigmoid": {"expert_gating": "softmax"}, "top-k": {"n_experts_used": 1},
        "weights norm": {"expert_weights_norm": False},
        "selection bias": {"expert_select_bias": False, "ignored_tensors": ("*exp_probs_b*",)}}),
    "nemotron_h": (write_nemotron_h, {}, {"no rope": {"nope_layers": ()}}),
    "falcon-h1": (write_falcon_h1, {}, {"neox": {"rope_neox": False}}),
    "falcon-h1-no-ssm-norm": (write_falcon_h1, dict(ssm_norm=False), {}),
    "granitehybrid": (write_granitehybrid, {}, {
        "embedding_scale": {"embed_scale": 1.0}, "residual_scale": {"residual_scale": 1.0},
        "attention.scale": {"attn_scale": 0.0}, "logit_scale": {"logit_scale": 1.0}}),
    "granitehybrid-rope": (write_granitehybrid, dict(rope=True, multipliers=False), {"rope": {"nope_layers": (True,) * 6}}),
    "granitehybrid-moe": (write_granitehybrid, dict(experts=(8, 2, 32), shared_ffn=48), {
        "top-k": {"n_experts_used": 1}, "shared expert": {"shared_ffn_dim": 0, "ignored_tensors": ("*shexp*",)}}),
    "qwen35": (write_qwen35, {}, {}),
    # a rotary pair left to M-RoPE's 4th section (position 0 for text): unrotated
    "qwen35-sections": (write_qwen35, dict(sections=(1, 0, 1, 2), n_rot=12), {"unrotated pairs": {"rope_freqs": ()}}),
    "qwen3next": (write_qwen35, dict(experts=(8, 2, 32), shared_ffn=48, qwen3next=True), {
        "grouped value heads": {"delta_grouped": False}}),
    "qwen35moe": (write_qwen35, dict(experts=(8, 2, 32), shared_ffn=48), {
        "top-k": {"n_experts_used": 1}, "weights norm": {"expert_weights_norm": False},
        "shared expert": {"shared_ffn_dim": 0, "ignored_tensors": ("*shexp*",)}}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("hybrids")


def _write(files: Path, name: str, qtype: str = "F32") -> Path:
    writer, options, _ = CASES[name]
    shape: dict[str, Any] = dict(d_model=256, ffn=512, n_heads=16, n_kv_heads=4, output_std=0.25) if qtype != "F32" else {}
    if qtype != "F32" and "experts" in options:  # expert widths of 256 for the K-quants
        options = dict(options, experts=(8, 2, 256), **({"shared_ffn": 256} if "shared_ffn" in options else {}))
    if qtype != "F32" and writer in (write_nemotron_h, write_falcon_h1):  # ssm_out's rows of 512
        shape = dict(shape, d_inner=512, ssm_heads=8)
    if qtype != "F32" and writer is write_qwen35:  # value width 256, 16 heads of 16 for the K-quants
        options, shape = dict(options, d_state=64), dict(shape, n_kv_heads=4)
    return writer(files / f"{name}-{qtype}.gguf", qtype=qtype, **options, **shape)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_llama_cpp(name: str, files: Path) -> None:
    path = _write(files, name)
    ids = token_ids()
    prefill = assert_matches(name, path, ids, llama_cpp_logits(path, ids))
    for step in (2, 7, 40):  # a chunk boundary anywhere in the convolution's window
        np.testing.assert_array_equal(ours(path, ids, step_tokens=step), prefill, err_msg=f"{name}: chunks of {step}")


# where each recurrent kernel takes its positions (a token at position 0 starts a fresh state)
POSITIONS_AT = {"short_conv": 5, "conv_silu": 7, "ssm_scan": 9, "delta_rule": 8}


def _restarting(kernel: Any, method: str, restart: Any) -> Any:
    at = POSITIONS_AT[method]

    def run(*args: Any) -> None:
        kernel(*args[:at], restart(args[at]).astype(np.int32), *args[at + 1 :])

    return run


def _no_state(kernel: Any, method: str) -> Any:  # every token afresh
    return _restarting(kernel, method, np.zeros_like)


def _forgets_at_16(kernel: Any, method: str) -> Any:  # the state restarts at position 16 too
    return _restarting(kernel, method, lambda p: np.where(p == 16, 0, p))


def _taps_reversed(kernel: Any, method: str) -> Any:
    def run(bcx: Any, w: Any, *rest: Any) -> None:
        kernel(bcx, np.ascontiguousarray(w[:, ::-1]), *rest)

    return run


def _ungated(kernel: Any, method: str) -> Any:
    def run(bcx: Any, *rest: Any) -> None:
        d = bcx.shape[1] // 3
        plain = bcx.copy()
        plain[:, d : 2 * d] = 1.0
        kernel(plain, *rest)

    return run


def _no_skip(kernel: Any, method: str) -> Any:
    def run(xbc: Any, zxdt: Any, dt_off: Any, dt_bias: Any, a: Any, d: Any, *rest: Any) -> None:
        kernel(xbc, zxdt, dt_off, dt_bias, a, np.zeros_like(d), *rest)

    return run


def _norm_ungated(kernel: Any, method: str) -> Any:
    def run(y: Any, z: Any, *rest: Any) -> None:
        kernel(y, np.full_like(z, 30.0), *rest)  # silu(30) = 30: a constant gate

    return run


def _attention_ungated(kernel: Any, method: str) -> Any:
    def run(x: Any, gate: Any) -> None:  # the attention output passes as it is
        pass

    return run


def _relu_unsquared(kernel: Any, method: str) -> Any:
    def run(x: Any, out: Any) -> None:
        np.maximum(x, 0.0, out=out)

    return run


def _attention_off(kernel: Any, method: str) -> Any:  # falcon-h1's Mamba2 alone
    def run(*args: Any) -> None:
        args[-1][:] = 0.0

    return run


# (case, the backend kernel broken, how, rows compared (from)
BROKEN = [("lfm2", "short_conv", _no_state, 0), ("lfm2", "short_conv", _taps_reversed, 0),
          ("lfm2", "short_conv", _ungated, 0), ("granitehybrid", "ssm_scan", _no_state, 0),
          ("granitehybrid", "ssm_scan", _forgets_at_16, 80), ("granitehybrid", "conv_silu", _no_state, 0),
          ("granitehybrid", "ssm_scan", _no_skip, 0), ("granitehybrid", "gated_group_rmsnorm", _norm_ungated, 0),
          ("qwen35", "delta_rule", _no_state, 0), ("qwen35", "delta_rule", _forgets_at_16, 80),
          ("qwen35", "conv_silu", _no_state, 0), ("qwen35", "head_rmsnorm_gate", _norm_ungated, 0),
          ("qwen35", "sigmoid_mul", _attention_ungated, 0), ("nemotron_h", "relu_sqr", _relu_unsquared, 0),
          ("nemotron_h", "ssm_scan", _forgets_at_16, 80), ("falcon-h1", "ssm_scan", _no_state, 0),
          ("falcon-h1", "attention", _attention_off, 0)]


@pytest.mark.parametrize(("name", "method", "broken", "first"), BROKEN,
                         ids=[f"{n}-{m}-{b.__name__.strip('_')}" for n, m, b, _ in BROKEN])
def test_recurrent_block_parts_bite(name: str, method: str, broken: Any, first: int, files: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above cannot pass with a part of the recurrent block broken (compared
    from row `first`: the Mamba2 state's reach past 64 tokens)."""
    path = _write(files, name)
    ids = token_ids()
    ref = llama_cpp_logits(path, ids)
    monkeypatch.setattr(CpuBackend, method, staticmethod(broken(getattr(CpuBackend, method), method)))
    rel, agree = compare(ours(path, ids)[first:], ref[first:])
    assert rel > REL_L2 or agree < TOP1, f"still relative L2 {rel:.2e}, top-1 {agree:.3f}"


ABLATIONS = [(name, feature) for name, case in CASES.items() for feature in case[2]]


@pytest.mark.parametrize(("name", "feature"), ABLATIONS, ids=[f"{n}-{f}" for n, f in ABLATIONS])
def test_feature_off_disagrees(name: str, feature: str, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(files, name)
    ids = token_ids()
    ref = llama_cpp_logits(path, ids)
    module = ARCHITECTURES[GGUFFile(path).architecture]
    real = module.config_from_gguf
    monkeypatch.setattr(module, "config_from_gguf", lambda f: dataclasses.replace(real(f), **CASES[name][2][feature]))
    rel, agree = compare(ours(path, ids), ref)
    assert rel > REL_L2 or agree < TOP1, f"{name} without {feature}: still relative L2 {rel:.2e}, top-1 {agree:.3f}"


QUANT = [(name, q) for name in ("lfm2", "lfm2moe", "granitehybrid", "granitehybrid-moe", "nemotron_h", "falcon-h1",
                                 "qwen35", "qwen35moe", "qwen3next")
         for q in ("Q8_0", "Q4_K")]


@pytest.mark.parametrize(("name", "qtype"), QUANT, ids=[f"{n}-{q}" for n, q in QUANT])
def test_quantized_kl(name: str, qtype: str, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_quantized_kl(f"{name} {qtype}", _write(files, name, qtype), monkeypatch)


def test_layer_kinds_and_refusals(files: Path) -> None:
    cfg = config_from_gguf(GGUFFile(_write(files, "lfm2")))
    assert cfg.conv_layers == (True, False, True, True, False, True) and cfg.kv_layers == (1, 4)
    assert cfg.state_shapes == (((2, 64),),) * 4 and cfg.recurrent
    g = config_from_gguf(GGUFFile(_write(files, "granitehybrid")))
    assert g.ssm_layers == (True, False, True, True, False, True) and g.kv_layers == (1, 4)
    assert g.state_shapes == (((3, 192), (8, 16, 16)),) * 4 and g.state_bytes == 4 * 4 * (3 * 192 + 8 * 16 * 16)
    bad = write_lfm2(files / "lfm2-mixed-kv.gguf", layers=("conv", "attn", "attn"))
    f = GGUFFile(bad)
    f.metadata["lfm2.attention.head_count_kv"] = [0, 2, 4]  # two attention layers, two KV head counts
    with pytest.raises(UnsupportedModelError, match=r"head_count_kv \[0, 2, 4\] must give its attention layers one"):
        config_from_gguf(f)
    f.metadata["lfm2.attention.head_count_kv"] = [0, 2]
    with pytest.raises(UnsupportedModelError, match=r"'lfm2\.attention\.head_count_kv' must hold 3 non-negative"):
        config_from_gguf(f)


def test_nemotron_and_falcon_layer_kinds(files: Path) -> None:
    n = config_from_gguf(GGUFFile(_write(files, "nemotron_h")))
    assert n.ssm_layers == tuple(k == "ssm" for k in NEMOTRON_LAYERS) and n.kv_layers == (2, 7)
    assert [i for i in range(n.n_layers) if not n.has_mixer(i)] == [1, 3, 6, 9] and n.activation == "relu2"
    assert [i for i in range(n.n_layers) if n.has_ffn(i)] == [1, 3, 6, 9] and len(n.state_shapes) == 4
    fal = config_from_gguf(GGUFFile(_write(files, "falcon-h1")))
    assert fal.kv_layers == (0, 1, 2, 3) and len(fal.state_shapes) == 4 and fal.parallel_ssm
    f = GGUFFile(_write(files, "nemotron_h"))
    f.metadata["nemotron_h.feed_forward_length"] = [128 if k != "ssm" else 0 for k in NEMOTRON_LAYERS]
    with pytest.raises(UnsupportedModelError, match="must each be attention .* an FFN .* or Mamba2"):
        config_from_gguf(f)  # an attention layer with an FFN width
    moe = config_from_gguf(GGUFFile(_write(files, "lfm2moe")))
    assert moe.dense_lead == 2 and [moe.is_moe(i) for i in range(6)] == [False, False, True, True, True, True]
    assert moe.expert_gating == "sigmoid" and moe.expert_select_bias and moe.dense_ffn_dim == 128


def test_qwen3next_layouts_it_cannot_run_are_refused(files: Path) -> None:
    f = GGUFFile(_write(files, "qwen3next"))
    cfg = config_from_gguf(f)
    assert cfg.delta_grouped and cfg.delta_key_heads == (0, 0, 1, 1) and cfg.rope_freqs == ()
    f.tensors["blk.0.ssm_in.weight"] = f.tensors["blk.0.attn_qkv.weight"]  # the early fused q k v z layout
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ssm_in\.weight: the early Qwen3-Next layout"):
        load_weights(f, cfg, CpuBackend(1))
    g = GGUFFile(_write(files, "qwen3next"))
    g.metadata["qwen3next.rope.dimension_sections"] = [2, 1, 1, 0]
    with pytest.raises(UnsupportedModelError, match="a Qwen3.5 file"):
        config_from_gguf(g)
