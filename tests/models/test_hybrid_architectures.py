"""The hybrid recurrent architectures against llama.cpp on tiny random-weight GGUFs written in
llama.cpp's layout (tests/support/hybrid_models.py), as test_architectures.py does for the
transformers: relative L2 <= 1e-3 and top-1 >= 99% in one prefill, one token a step, in chunks
of several sizes (bit-identical to the prefill: a chunk resumes from the state the last one
left), and batched with another sequence (bit-identical). Each part of the recurrent block
switched off (its state, its taps' order, the c gate) fails the comparison. Quantized to Q8_0
and Q4_K (the convolution's taps stay float32, as llama-quantize leaves them): mean KL <= 0.01."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arch_compare import MEAN_KL, REL_L2, TOP1, assert_matches, compare, llama_cpp_logits, ours, token_ids
from hybrid_models import write_lfm2
from llama_oracle import kl_rows

from edge_infer.errors import UnsupportedModelError
from edge_infer.formats.gguf import GGUFFile
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.models import ARCHITECTURES, config_from_gguf

# name: the writer options that make the case's features bite
CASES: dict[str, dict[str, Any]] = {
    "lfm2": {},
    "lfm2-swa": dict(sliding_window=8),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("hybrids")


def _write(files: Path, name: str, qtype: str = "F32") -> Path:
    shape: dict[str, Any] = dict(d_model=256, ffn=512, n_heads=16, n_kv_heads=4, output_std=0.25) if qtype != "F32" else {}
    return write_lfm2(files / f"{name}-{qtype}.gguf", qtype=qtype, **CASES[name], **shape)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_llama_cpp(name: str, files: Path) -> None:
    path = _write(files, name)
    ids = token_ids()
    prefill = assert_matches(name, path, ids, llama_cpp_logits(path, ids))
    for step in (2, 7, 40):  # a chunk boundary anywhere in the convolution's window
        np.testing.assert_array_equal(ours(path, ids, step_tokens=step), prefill, err_msg=f"{name}: chunks of {step}")


def _no_state(kernel: Any) -> Any:
    def run(bcx: Any, w: Any, state: Any, seq_slot: Any, token_seq: Any, positions: Any, *rest: Any) -> None:
        kernel(bcx, w, state, seq_slot, token_seq, np.zeros_like(positions), *rest)  # every token starts afresh

    return run


def _taps_reversed(kernel: Any) -> Any:
    def run(bcx: Any, w: Any, *rest: Any) -> None:
        kernel(bcx, np.ascontiguousarray(w[:, ::-1]), *rest)

    return run


def _ungated(kernel: Any) -> Any:
    def run(bcx: Any, *rest: Any) -> None:
        d = bcx.shape[1] // 3
        plain = bcx.copy()
        plain[:, d : 2 * d] = 1.0
        kernel(plain, *rest)

    return run


@pytest.mark.parametrize("broken", [_no_state, _taps_reversed, _ungated], ids=["state", "tap order", "c gate"])
def test_recurrent_block_parts_bite(broken: Any, files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above cannot pass with a part of the short convolution broken."""
    path = _write(files, "lfm2")
    ids = token_ids()
    ref = llama_cpp_logits(path, ids)
    monkeypatch.setattr(CpuBackend, "short_conv", staticmethod(broken(CpuBackend.short_conv)))
    rel, agree = compare(ours(path, ids), ref)
    assert rel > REL_L2 or agree < TOP1, f"still relative L2 {rel:.2e}, top-1 {agree:.3f}"


def test_sliding_window_bites(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(files, "lfm2-swa")
    ids = token_ids()
    ref = llama_cpp_logits(path, ids)
    module = ARCHITECTURES["lfm2"]
    real = module.config_from_gguf
    monkeypatch.setattr(module, "config_from_gguf",
                        lambda f: dataclasses.replace(real(f), swa_layers=(False,) * real(f).n_layers))
    rel, agree = compare(ours(path, ids), ref)
    assert rel > REL_L2 or agree < TOP1, f"full attention: still relative L2 {rel:.2e}, top-1 {agree:.3f}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_quantized_kl(qtype: str, files: Path) -> None:
    path = _write(files, "lfm2", qtype)
    ids = token_ids()
    kl = float(kl_rows(llama_cpp_logits(path, ids), ours(path, ids)).mean())
    assert kl <= MEAN_KL, f"lfm2 {qtype}: mean KL {kl:.4f} vs llama.cpp"


def test_layer_kinds_and_refusals(files: Path) -> None:
    cfg = config_from_gguf(GGUFFile(_write(files, "lfm2")))
    assert cfg.conv_layers == (True, False, True, True, False, True) and cfg.kv_layers == (1, 4)
    assert cfg.state_shapes == ((2, 64),) * 4 and cfg.recurrent
    bad = write_lfm2(files / "lfm2-mixed-kv.gguf", layers=("conv", "attn", "attn"))
    f = GGUFFile(bad)
    f.metadata["lfm2.attention.head_count_kv"] = [0, 2, 4]  # two attention layers, two KV head counts
    with pytest.raises(UnsupportedModelError, match=r"head_count_kv \[0, 2, 4\] must give its attention layers one"):
        config_from_gguf(f)
    f.metadata["lfm2.attention.head_count_kv"] = [0, 2]
    with pytest.raises(UnsupportedModelError, match=r"'lfm2\.attention\.head_count_kv' must hold 3 non-negative"):
        config_from_gguf(f)
