"""The non-linear and codebook weight types end to end: a tiny random llama (256-wide rows, so
every type fits) quantized by llama.cpp's own quantizer, pure (every matrix, output and token
embedding included, in the one type), loaded and computed by our float path. Its logits agree
with exact math (the float64 NumPy reference forward of the same file) and with llama.cpp on
the same file (which quantizes activations to 8 bits for these types, so the bar is KL).

IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ1_S / IQ1_M need an importance matrix in llama.cpp's quantizer,
and its MXFP4 goes to expert tensors only: their codecs are checked bit for bit against ggml in
tests/formats/test_quants.py and tests/kernels_cpu/test_dequant_kernels.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from llama_oracle import LlamaCpp, kl_rows
from support.quant_helpers import llama_quantize, tensor_types
from support.tiny_models import write_tiny_llama

from edge_infer import LLM

lc = pytest.importorskip("llama_cpp")

FTYPES = {  # our type -> llama.cpp's llama_ftype
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    "IQ3_S": "LLAMA_FTYPE_MOSTLY_IQ3_S",
    "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0", "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
}
N_IDS = 48
EXACT_KL = 1e-4  # ours vs float64 math on the same weights: float32 rounding only (this F32 file: 9e-6)
LLAMA_CPP_KL = 0.01  # vs llama.cpp, unless llama.cpp is the further from exact math (its 8-bit activations)


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("codebook")
    return write_tiny_llama(d / "f32.gguf", n_layers=2, d_model=256, ffn=512, n_heads=4, n_kv_heads=2)


@pytest.mark.parametrize("name", list(FTYPES))
def test_llama_cpp_s_file_computes_like_exact_math_and_llama_cpp(src: Path, name: str, tmp_path: Path) -> None:
    from reference_forward import reference_logits

    qtype = int(T[name])
    path = llama_quantize(src, tmp_path / f"{name}.gguf", getattr(lc, FTYPES[name]), pure=True,
                          output_type=qtype, embd_type=qtype)
    matrices = {n: t for n, t in tensor_types(path).items() if "norm" not in n}
    assert set(matrices.values()) == {name}, matrices
    ids = [int(t) for t in np.random.default_rng(qtype).integers(0, 256, N_IDS)]
    with LLM(str(path), n_threads=2, kv_cache_memory="16MiB") as llm:
        assert llm.plan is not None
        ours = llm.prompt_logits(ids)
    exact = reference_logits(path, ids)
    m = LlamaCpp(path, len(ids))
    try:
        theirs = m.logits(ids)
    finally:
        m.close()
    to_exact, to_llama_cpp = float(kl_rows(exact, ours).mean()), float(kl_rows(theirs, ours).mean())
    theirs_to_exact = float(kl_rows(exact, theirs).mean())
    print(f"\n{name}: mean KL vs exact: ours {to_exact:.3g}, llama.cpp's {theirs_to_exact:.3g}; "
          f"ours vs llama.cpp {to_llama_cpp:.3g}")
    assert to_exact <= EXACT_KL, f"{name}: mean KL(exact || ours) {to_exact:.3g}"
    assert to_llama_cpp <= LLAMA_CPP_KL or to_exact < theirs_to_exact, (
        f"{name}: mean KL(llama.cpp || ours) {to_llama_cpp:.3g}, and llama.cpp is the nearer to exact math")
