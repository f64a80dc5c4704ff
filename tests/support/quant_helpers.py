"""Helpers of the quantization tests: ggml's C library, llama.cpp's own quantizer (llama_model_quantize through
llama-cpp-python: the tests need no llama-quantize binary), a file's tensor types, and the
NLL of a token sequence under llama.cpp and under edge-infer."""

from __future__ import annotations

import ctypes
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from edge_infer.formats.gguf import GGUFFile


def llama_quantize(src: Path, dst: Path, ftype: int, *, pure: bool = False, output_type: int | None = None,
                   embd_type: int | None = None) -> Path:
    """llama.cpp's quantization of src into dst (ftype: a llama_ftype)."""
    lc = pytest.importorskip("llama_cpp")
    p = lc.llama_model_quantize_default_params()
    p.ftype, p.pure, p.nthread = ftype, pure, 2
    if output_type is not None:
        p.output_tensor_type = output_type
    if embd_type is not None:
        p.token_embedding_type = embd_type
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), p)
    assert rc == 0, f"llama_model_quantize failed ({rc})"
    return dst


def llama_quantize_types(src: Path, ftype: int, tmp: Path) -> dict[str, str]:
    """The type llama.cpp's quantizer would give each tensor of src at ftype without an
    importance matrix: its dry run (which plans even the file types that need one), read from
    its log."""
    lc = pytest.importorskip("llama_cpp")
    from llama_cpp import _logger

    lines: list[str] = []

    @lc.llama_log_callback
    def keep(level: int, text: bytes, user: object) -> None:
        lines.append(text.decode(errors="replace"))

    p = lc.llama_model_quantize_default_params()
    p.ftype, p.dry_run, p.nthread = ftype, True, 1
    lc.llama_log_set(keep, None)
    try:
        rc = lc.llama_model_quantize(str(src).encode(), str(tmp / "dry.gguf").encode(), p)
    finally:
        lc.llama_log_set(_logger.llama_log_callback, None)
    assert rc == 0, f"llama_model_quantize (dry run) failed ({rc})"
    out = {}
    for m in re.finditer(r"\] (\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^\n(]*(?:\((\S+)\))?", "".join(lines)):
        out[m.group(1)] = (m.group(3) or m.group(2)).upper()
    return out


def tensor_types(path: Path) -> dict[str, str]:
    with GGUFFile(path) as f:
        return {n: t.type.name for n, t in f.tensors.items()}


def nll(logits: np.ndarray, ids: list[int]) -> float:
    """Mean NLL of ids[1:] under rows logits[:-1] (float64)."""
    z = logits[:-1].astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return float((lse - z[np.arange(len(ids) - 1), ids[1:]]).mean())


def ggml_base() -> ctypes.CDLL | None:
    """llama-cpp-python's bundled libggml-base (ggml's C quantizers), or None."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        p = Path(next(iter(spec.submodule_search_locations))) / "lib" / name
        if p.exists():
            return ctypes.CDLL(str(p))
    return None


def ggml_quantize_chunk() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    """ggml's `ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix)` (skips the
    test without libggml-base): what llama_model_quantize calls per chunk of rows."""
    lib = ggml_base()
    if lib is None:
        pytest.skip("no libggml-base (llama-cpp-python)")
    fn = lib.ggml_quantize_chunk
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    return fn


def ggml_requantize(src: Path, dst: Path, qtype: int, imatrix: object,
                    keep: list[tuple[str, int]] | None = None, mix: str | None = None) -> Path:
    """dst: src with every matrix at qtype (those matching keep's patterns at theirs) quantized
    by ggml's `ggml_quantize_chunk` under imatrix (a formats.imatrix.Imatrix), the function
    llama_model_quantize calls per chunk of rows: llama.cpp's bytes for the types it writes
    only with an importance matrix, whose C++ map ctypes cannot build. mix: a llama.cpp file
    type ("iq2_xs") whose per-tensor plan to follow instead (qtype then unused)."""
    from gguf import GGMLQuantizationType as T
    from gguf import LlamaFileType as FT

    from edge_infer.formats import requantize as rq
    from edge_infer.formats.quant_policy import Target
    from edge_infer.formats.quants import BLOCK_LAYOUTS

    fn = ggml_quantize_chunk()

    def ggml_quantize(x: np.ndarray, new: T, imp: np.ndarray | None) -> np.ndarray:
        lay = BLOCK_LAYOUTS[new]
        x = np.ascontiguousarray(x, np.float32)
        out = np.empty((x.shape[0], x.shape[1] // lay.block_size * lay.type_size), np.uint8)
        w = None if imp is None else np.ascontiguousarray(imp, np.float32)
        fn(int(new), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], None if w is None else w.ctypes.data)
        return out

    from edge_infer.formats.quant_policy import parse_target

    name = T(qtype).name
    target = parse_target(mix) if mix else Target(name.lower(), T(qtype), FT[f"MOSTLY_{name}"], mix=False)
    rq.requantize(src, dst, target,
                  keep=[(p, T(t)) for p, t in keep or []], imatrix=imatrix,  # type: ignore[arg-type]
                  quantizer=ggml_quantize)
    return dst


def random_blocks(rng: np.random.Generator, qtype: int, n_blocks: int) -> np.ndarray:
    """n_blocks of GGML type qtype (uint8, n_blocks * type_size): random codes, finite scales
    (every f16 field ~N(0, 0.05); MXFP4's exponent near 2^-7; IQ1_M's f16 scattered over the top
    nibbles of its four scale words). For the types edge-infer reads but does not write."""
    from edge_infer.formats.weight_types import IQ1_M, MXFP4, weight_type

    t = weight_type(qtype)
    raw = rng.integers(0, 256, n_blocks * t.type_size, dtype=np.uint8)
    b = raw.view(t.dtype)
    d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
    if "d" in (t.dtype.names or ()):
        b["d"] = d
    if qtype == MXFP4:
        b["e"] = rng.integers(115, 125, n_blocks)
    if qtype == IQ1_M:
        words = np.ascontiguousarray(b["scales"]).view(np.uint16).reshape(n_blocks, 4)
        bits = d.view(np.uint16)[:, None]
        words = (words & 0x0FFF) | (((bits >> (4 * np.arange(4, dtype=np.uint16))) & 0xF) << 12)
        b["scales"] = words.astype(np.uint16).view(np.uint8).reshape(n_blocks, 8)
    return raw
