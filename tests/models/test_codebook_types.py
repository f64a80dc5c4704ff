"""The non-linear and codebook weight types end to end: a tiny random llama (256-wide rows, so
every type fits) quantized by llama.cpp's own quantizer, pure (every matrix, output and token
embedding included, in the one type), loaded and computed by our int8 kernels (IQ4_NL, MXFP4;
the K-quant kernel's IQ4_XS, ternary and grid forms). Its logits agree with exact math (the float64 NumPy reference
forward of the same file: to float32 rounding on the float path; no further than llama.cpp's
own on the int8 one, both quantizing activations to 8 bits) and with llama.cpp on the same file
(which quantizes activations to 8 bits for these types, so the bar is KL).

IQ2_XXS / IQ2_XS / IQ2_S, IQ1_S / IQ1_M need an importance matrix in llama.cpp's quantizer (and
IQ3_XXS for the token embedding): ggml's, under a random one. MXFP4 goes to expert tensors only.
The codecs are checked bit for bit against ggml in tests/formats/test_quants.py and
tests/kernels_cpu/test_dequant_kernels.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from llama_oracle import LlamaCpp, kl_rows
from support.quant_helpers import ggml_requantize, llama_quantize, tensor_types
from support.tiny_models import write_tiny_llama

from edge_infer import LLM
from edge_infer.formats.gguf import GGUFFile
from edge_infer.formats.imatrix import Imatrix
from edge_infer.kernels_cpu import target
from edge_infer.kernels_cpu.repack_i8 import E8M0_IN_F16

lc = pytest.importorskip("llama_cpp")

FTYPES = {  # our type -> llama.cpp's llama_ftype
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    "IQ3_S": "LLAMA_FTYPE_MOSTLY_IQ3_S",
    "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0", "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
}
N_IDS = 48
EXACT_KL = 1e-4  # ours vs float64 math on the same weights: float32 rounding only (this F32 file: 9e-6)
LLAMA_CPP_KL = 0.01  # vs llama.cpp, unless llama.cpp is the further from exact math (its 8-bit activations)
INT8_VS_LLAMA_CPP = 1.25  # int8 path: KL to exact math at most this times llama.cpp's (IQ4_NL: 0.0132 vs 0.0131)


def _kls(path: Path, ids: list[int], ours: np.ndarray, exact: np.ndarray, label: str) -> tuple[float, float, float]:
    """llama.cpp's logits on the same file, then the mean KLs (exact || ours), (exact ||
    llama.cpp's), (llama.cpp's || ours), printed."""
    m = LlamaCpp(path, len(ids))
    try:
        theirs = m.logits(ids)
    finally:
        m.close()
    to_exact, to_llama_cpp = float(kl_rows(exact, ours).mean()), float(kl_rows(theirs, ours).mean())
    theirs_to_exact = float(kl_rows(exact, theirs).mean())
    print(f"\n{label}: mean KL vs exact: ours {to_exact:.3g}, llama.cpp's {theirs_to_exact:.3g}; "
          f"ours vs llama.cpp {to_llama_cpp:.3g}")
    return to_exact, theirs_to_exact, to_llama_cpp


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("codebook")
    return write_tiny_llama(d / "f32.gguf", n_layers=2, d_model=256, ffn=512, n_heads=4, n_kv_heads=2)


@pytest.mark.parametrize("name", list(FTYPES))
def test_llama_cpp_s_file_computes_like_exact_math_and_llama_cpp(src: Path, name: str, tmp_path: Path) -> None:
    qtype = int(T[name])
    path = llama_quantize(src, tmp_path / f"{name}.gguf", getattr(lc, FTYPES[name]), pure=True,
                          output_type=qtype, embd_type=qtype)
    _check_file(path, name)


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ1_S", "IQ1_M"])
def test_imatrix_types_compute_like_exact_math_and_llama_cpp(src: Path, name: str, tmp_path: Path) -> None:
    """The types llama.cpp writes only under an importance matrix: ggml's quantizer with a
    random one (tests/support/quant_helpers.ggml_requantize), every matrix at the type."""
    rng = np.random.default_rng(int(T[name]))
    imatrix = Imatrix()
    with GGUFFile(src) as f:
        for n, t in f.tensors.items():
            if len(t.shape) == 2:
                imatrix.add(n, rng.uniform(0.1, 4.0, t.shape[0]), 1)
    path = ggml_requantize(src, tmp_path / f"{name}.gguf", int(T[name]), imatrix, keep=[("output.weight", int(T[name]))])
    _check_file(path, name)


def _check_file(path: Path, name: str) -> None:
    """path's logits (every matrix at type `name`) against exact math and llama.cpp's."""
    from reference_forward import reference_logits

    qtype = int(T[name])
    matrices = {n: t for n, t in tensor_types(path).items() if "norm" not in n}
    assert set(matrices.values()) == {name}, matrices
    ids = [int(t) for t in np.random.default_rng(qtype).integers(0, 256, N_IDS)]
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
        assert llm.plan is not None
        ours = llm.prompt_logits(ids)
    llm_int8 = None if target.matrix_path(qtype, 256) == target.FLOAT_PATH else target.matrix_path(qtype, 256)
    to_exact, theirs_to_exact, to_llama_cpp = _kls(path, ids, ours, reference_logits(path, ids), name)
    bound = EXACT_KL if llm_int8 is None else INT8_VS_LLAMA_CPP * theirs_to_exact
    assert to_exact <= bound, f"{name}: mean KL(exact || ours) {to_exact:.3g} ({llm_int8 or 'float path'})"
    assert to_llama_cpp <= LLAMA_CPP_KL or to_exact < theirs_to_exact, (
        f"{name}: mean KL(llama.cpp || ours) {to_llama_cpp:.3g}, and llama.cpp is the nearer to exact math")


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS"])
def test_our_quantizer_writes_llama_quantize_s_bytes(src: Path, name: str, tmp_path: Path) -> None:
    """`edge-infer quantize --type iq4_nl | iq4_xs` (no importance matrix) writes each matrix
    byte for byte as llama.cpp's quantizer does (its search is deterministic)."""
    from edge_infer.formats.quant_policy import parse_target
    from edge_infer.formats.requantize import requantize

    qtype = int(T[name])
    theirs = llama_quantize(src, tmp_path / "theirs.gguf", getattr(lc, FTYPES[name]), pure=True)
    ours = tmp_path / "ours.gguf"
    requantize(src, ours, parse_target(name.lower()))
    with GGUFFile(theirs) as a, GGUFFile(ours) as b:
        same_type = [n for n, t in b.tensors.items() if t.type == qtype]
        assert len(same_type) >= 7 * 2  # every layer matrix
        for n in same_type:
            assert a.tensors[n].type == qtype and np.array_equal(a.tensors[n].data, b.tensors[n].data), n


@pytest.mark.parametrize("name", ["iq3_s", "iq3_m"])
def test_our_grid_files_are_llama_quantize_s(src: Path, name: str, tmp_path: Path) -> None:
    """`edge-infer quantize --type iq3_s | iq3_m` (the file types llama.cpp writes without an
    importance matrix) writes llama.cpp's whole file, tensor for tensor and byte for byte: its
    mix (IQ3_S, Q4_K, Q6_K) and every block of each."""
    from edge_infer.formats.quant_policy import parse_target
    from edge_infer.formats.requantize import requantize

    target = parse_target(name)
    theirs = llama_quantize(src, tmp_path / "theirs.gguf", int(target.file_type))
    ours = tmp_path / "ours.gguf"
    requantize(src, ours, target)
    with GGUFFile(theirs) as a, GGUFFile(ours) as b:
        assert {n: t.type for n, t in a.tensors.items()} == {n: t.type for n, t in b.tensors.items()}
        assert T.IQ3_S in {t.type for t in b.tensors.values()}
        for n, t in b.tensors.items():
            assert np.array_equal(a.tensors[n].data, t.data), n


def test_mxfp4_experts_compute_like_llama_cpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss's expert format: a tiny qwen3moe quantized by llama.cpp to MXFP4_MOE (experts
    MXFP4, the other matrices Q8_0) runs its experts on the int8 kernel's MXFP4 table format and
    agrees with llama.cpp on the same file, and with our float path's experts (float32
    activations on the decoded weights) no worse than llama.cpp does."""
    from arch_models import write_arch_model

    from edge_infer.kernels_cpu import backend

    src = write_arch_model(tmp_path / "f32.gguf", "qwen3moe", d_model=256, n_heads=4, n_kv_heads=2,
                           experts=(8, 3, 256), context_length=256, n_layers=2)
    path = llama_quantize(src, tmp_path / "mxfp4.gguf", lc.LLAMA_FTYPE_MOSTLY_MXFP4_MOE)
    types = tensor_types(path)
    assert {t for n, t in types.items() if "_exps" in n} == {"MXFP4"}
    with GGUFFile(path) as f:  # scales an f16 holds: the int8 kernel takes them (repack_i8)
        e = np.concatenate([t.data.reshape(-1, 17)[:, 0] for n, t in f.tensors.items() if "_exps" in n])
    assert E8M0_IN_F16[0] <= e.min() and e.max() <= E8M0_IN_F16[1]
    assert target.matrix_path(int(T.MXFP4), 256).startswith("int8")
    ids = [int(t) for t in np.random.default_rng(39).integers(0, 256, N_IDS)]
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
        ours = llm.prompt_logits(ids)
    no_mxfp4 = {role: tuple(t for t in ts if t != T.MXFP4) for role, ts in backend.I8_TYPES.items()}
    monkeypatch.setattr(backend, "I8_TYPES", no_mxfp4)
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
        exact = llm.prompt_logits(ids)  # the experts on the float path
    to_exact, theirs_to_exact, to_llama_cpp = _kls(path, ids, ours, exact, "MXFP4 experts (exact: the float path)")
    assert to_llama_cpp <= LLAMA_CPP_KL and to_exact <= INT8_VS_LLAMA_CPP * theirs_to_exact


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS", "IQ3_S", "TQ2_0"])
def test_a_scrambled_form_fails_the_comparison(src: Path, name: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail, and on small errors: each kind of form (the int8 kernel's
    table, the K-quant kernel's table, grid and ternary codes) with the low bit of its repacked
    code bytes flipped (all of the int8 form's; the first 64 bytes of each K-quant record, 1/16
    to 1/8 of its weights: neighbouring table values, other grid rows) fails it (KL 0.6-14)."""
    from edge_infer.kernels_cpu import backend
    from edge_infer.kernels_cpu.repack_i8 import I8Weights
    from edge_infer.kernels_cpu.repack_k import KWeights

    repack_i8, repack_k = backend.repack, backend.repack_k

    def scrambled_i8(*args: object) -> I8Weights | None:
        iw = repack_i8(*args)  # type: ignore[arg-type]
        if iw is not None:
            iw.wi[...] ^= np.uint8(0x01)
        return iw

    def scrambled_k(*args: object) -> KWeights:
        kw = repack_k(*args)  # type: ignore[arg-type]
        form = kw.wk, kw.args[3]
        form[0][:, :, form[1] : form[1] + 64] ^= np.uint8(0x01)
        return kw

    monkeypatch.setattr(backend, "repack", scrambled_i8)
    monkeypatch.setattr(backend, "repack_k", scrambled_k)
    qtype = int(T[name])
    path = llama_quantize(src, tmp_path / f"{name}.gguf", getattr(lc, FTYPES[name]), pure=True,
                          output_type=qtype, embd_type=qtype)
    with pytest.raises(AssertionError, match="mean KL"):
        _check_file(path, name)
