"""Tensor types of `edge-infer quantize`: every target and mix picks, tensor for tensor, what
llama.cpp's own quantizer picks for the same file (llama_model_quantize on a 16-layer model
whose widths fit K-quants, untied and tied), overrides and errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as FT
from support.quant_helpers import llama_quantize, llama_quantize_types, tensor_types
from support.tiny_models import write_tiny_llama

from edge_infer.errors import InvalidRequest
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.quant_policy import MIXES, PLAIN, parse_keep, parse_target
from edge_infer.formats.requantize import plan

pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def src(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("policy")
    # 16 layers: the mixes' first-eighth / first-sixteenth / every-third-layer rules all show
    return write_tiny_llama(d / "f32.gguf", n_layers=16, d_model=256, ffn=512, n_heads=4, n_kv_heads=1,
                            tied=request.param)


def _ours(src: Path, name: str, has_imatrix: bool = False) -> dict[str, str]:
    with GGUFFile(src) as f:
        return {p.name: p.new_type.name for p in plan(f, parse_target(name), [], has_imatrix)}


GRID_MIXES = [n for n in MIXES if n.startswith("iq")]


@pytest.mark.parametrize("name", [n for n in MIXES if n not in GRID_MIXES]
                         + ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q6_k", "f16"])
def test_types_match_llama_cpp(src: Path, name: str, tmp_path: Path) -> None:
    ft = (MIXES.get(name) or PLAIN[name])[1]
    theirs = tensor_types(llama_quantize(src, tmp_path / "l.gguf", int(ft)))
    assert _ours(src, name) == theirs


@pytest.mark.parametrize("name", GRID_MIXES)
def test_grid_mixes_match_llama_cpp_s_plan(src: Path, name: str, tmp_path: Path) -> None:
    """llama.cpp writes most grid files only under an importance matrix, which ctypes cannot
    hand it: its dry run says what it would write (the plan without one)."""
    assert _ours(src, name) == llama_quantize_types(src, int(MIXES[name][1]), tmp_path)


def test_grid_mixes_under_an_importance_matrix() -> None:
    """What changes with one (llama.cpp's has_imatrix rules): IQ3_XXS keeps attn_v and
    ffn_down at IQ3_XXS (without: IQ3_S, Q4_K / Q3_K); d_model 256 = 4 kv heads x 64 here."""
    names = [("blk.0.attn_v.weight", (256, 256)), ("blk.0.ffn_down.weight", (512, 256)),
             ("blk.9.ffn_down.weight", (512, 256))]
    from edge_infer.formats.quant_policy import choose_types

    t = parse_target("iq3_xxs")
    assert list(choose_types(names, t, [], 16, 1, has_imatrix=True).values()) == [T.IQ3_XXS] * 3
    assert list(choose_types(names, t, [], 16, 1, has_imatrix=False).values()) == [T.IQ3_S, T.Q4_K, T.Q3_K]


@pytest.mark.parametrize("name", ["q2_k", "q3_k", "q4_k", "q5_k"])
def test_plain_k_types_are_llama_cpp_pure_with_a_q6_k_output(src: Path, name: str, tmp_path: Path) -> None:
    tied = "output.weight" not in tensor_types(src)
    theirs = tensor_types(llama_quantize(src, tmp_path / "l.gguf", int(PLAIN[name][1]), pure=True,
                                         output_type=int(T.Q6_K), embd_type=int(T.Q6_K) if tied else None))
    assert _ours(src, name) == theirs


def test_keep_overrides_and_row_length_fallbacks(tmp_path: Path) -> None:
    src = write_tiny_llama(tmp_path / "m.gguf", n_layers=2, d_model=64, ffn=128)  # 64 wide: no K-quant fits
    with GGUFFile(src) as f:
        types = {p.name: p.new_type for p in plan(f, parse_target("q4_k_m"), [parse_keep("blk.0.*=q8_0")])}
    assert types["blk.0.attn_q.weight"] == T.Q8_0 and types["blk.0.ffn_up.weight"] == T.Q8_0
    assert types["blk.1.attn_q.weight"] == T.Q5_0  # Q4_K falls back on 64-element rows
    assert types["blk.1.attn_norm.weight"] == T.F32  # norms are never quantized
    assert types["output.weight"] == T.Q8_0  # Q6_K does not fit either


@pytest.mark.parametrize("spec, message", [
    ("blk.0.*", "expected PATTERN=TYPE"), ("=q8_0", "expected PATTERN=TYPE"), ("blk.*=q9_9", "unknown type"),
])
def test_bad_keep_is_refused(spec: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        parse_keep(spec)


def test_unknown_type_and_unmatched_pattern_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="unknown --type 'q4_k_x'; choose one of: f32, f16"):
        parse_target("q4_k_x")
    src = write_tiny_llama(tmp_path / "m.gguf", n_layers=1)
    with GGUFFile(src) as f, pytest.raises(InvalidRequest, match="matches no tensor"):
        plan(f, parse_target("q8_0"), [parse_keep("layers.0.*=q8_0")])


def test_file_types_are_llama_cpp_s() -> None:
    assert PLAIN["q4_k"][1] == FT.MOSTLY_Q4_K_S and MIXES["q2_k_m"][1] == FT.MOSTLY_Q2_K
