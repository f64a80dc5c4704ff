"""Requantize a GGUF model: every tensor dequantized to float32 and quantized again to the type
quant_policy chose for it (optionally importance-weighted), the metadata and tokenizer carried
over with `general.file_type` updated, written atomically (a temporary file beside the output,
renamed only once it is complete).

A tensor whose new type equals its type in the source is copied as it is (requantizing it
from its own dequantized values could only add error); tensors the policy does not quantize
(norms, biases, the MoE router) are copied byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType, GGUFWriter

from edge_infer.errors import InvalidRequest
from edge_infer.formats.atomic import commit, temp_beside
from edge_infer.formats.gguf import GGUFFile, TensorInfo
from edge_infer.formats.imatrix import Imatrix
from edge_infer.formats.quant_policy import Target, choose_types
from edge_infer.formats.quants import BLOCK_LAYOUTS, dequantize_blocks, quantize

CHUNK_ROWS = 4096  # rows dequantized and quantized at a time (bounds the float32 copy)
# (rows float32 [n, cols], type, importance float32 [cols] or None) -> the rows' blocks uint8 [n, row bytes]
BlockQuantizer = Callable[[np.ndarray, T, "np.ndarray | None"], np.ndarray]
_VALUE_TYPES = {t.name.lower(): t for t in GGUFValueType}
_SET_BY_US = ("general.architecture", "general.file_type", "general.quantization_version", "general.alignment")
Progress = Callable[[str, int], None]  # (tensor name, its element count) after each tensor


@dataclass(frozen=True)
class TensorPlan:
    """One tensor's fate: GGUF shape (ne0 first), its type and bytes before and after."""

    name: str
    shape: tuple[int, ...]
    src_type: T
    new_type: T
    src_bytes: int
    new_bytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def requantized(self) -> bool:
        return self.new_type != self.src_type


def _nbytes(t: T, shape: tuple[int, ...]) -> int:
    lay = BLOCK_LAYOUTS[t]
    return int(np.prod(shape)) // lay.block_size * lay.type_size


def plan(f: GGUFFile, target: Target, keep: list[tuple[str, T]], has_imatrix: bool = False) -> list[TensorPlan]:
    """The new type of every tensor of f, in file order."""
    arch = f.architecture
    n_layer = int(f.metadata.get(f"{arch}.block_count", 0))
    heads, kv = f.metadata.get(f"{arch}.attention.head_count", 1), f.metadata.get(f"{arch}.attention.head_count_kv", 1)
    heads = heads[0] if isinstance(heads, list) else heads
    kv = kv[0] if isinstance(kv, list) else kv
    n_gqa = int(heads) // max(1, int(kv or 1))
    types = choose_types([(n, t.shape) for n, t in f.tensors.items()], target, keep, n_layer, n_gqa, has_imatrix)
    out = []
    for name, t in f.tensors.items():
        chosen = types[name]
        new = t.type if chosen is None else chosen  # (F32 is type 0: no `or` here)
        out.append(TensorPlan(name, t.shape, t.type, new, t.nbytes, t.nbytes if new == t.type else _nbytes(new, t.shape)))
    return out


def _quantized_data(t: TensorInfo, new: T, imatrix: Imatrix | None, quantizer: BlockQuantizer) -> np.ndarray:
    """t's values in type `new`: uint8 [..., rows, row bytes] (numpy order)."""
    ncols = t.shape[0]
    rows_per_mat = int(np.prod(t.shape[1:2])) if len(t.shape) > 1 else 1
    n_mat = int(np.prod(t.shape[2:])) if len(t.shape) > 2 else 1
    src_row = BLOCK_LAYOUTS[t.type].type_size * ncols // BLOCK_LAYOUTS[t.type].block_size
    new_row = BLOCK_LAYOUTS[new].type_size * ncols // BLOCK_LAYOUTS[new].block_size
    raw = np.ascontiguousarray(t.data).reshape(n_mat * rows_per_mat, src_row)
    out = np.empty((n_mat * rows_per_mat, new_row), np.uint8)
    imp = imatrix.importance(t.name, ncols) if imatrix is not None else None
    if imp is not None and imp.shape[0] not in (1, n_mat):
        raise InvalidRequest(f"importance matrix entry {t.name!r} has {imp.shape[0]} matrices, the tensor has {n_mat}")
    for e in range(n_mat):
        for s in range(e * rows_per_mat, (e + 1) * rows_per_mat, CHUNK_ROWS):
            stop = min(s + CHUNK_ROWS, (e + 1) * rows_per_mat)
            x = dequantize_blocks(raw[s:stop], t.type, (stop - s) * ncols).reshape(stop - s, ncols)
            if not np.isfinite(x).all():
                raise InvalidRequest(f"tensor {t.name!r} has non-finite values (rows {s}..{stop - 1}): not quantized")
            out[s:stop] = quantizer(x, new, None if imp is None else imp[e % imp.shape[0]])
    return out.reshape(*reversed(t.shape[1:]), new_row)


def _copy_kv(f: GGUFFile, w: GGUFWriter) -> None:
    for key, val in f.metadata.items():
        if key in _SET_BY_US or key.startswith("GGUF."):
            continue
        tname = f.metadata_types[key]
        if tname.startswith("array["):
            w.add_key_value(key, val, GGUFValueType.ARRAY, _VALUE_TYPES[tname[6:-1]])
        else:
            w.add_key_value(key, val, _VALUE_TYPES[tname])


def check_output(src: str | os.PathLike[str], dst: str | os.PathLike[str], force: bool) -> Path:
    """dst as a Path, or the InvalidRequest that writing it would be: the input itself, a
    folder, an existing file without force, a missing folder."""
    dst_p = Path(dst)
    if dst_p.exists() and dst_p.resolve() == Path(src).resolve():
        raise InvalidRequest(f"{dst}: the output is the input file; write to another path")
    if dst_p.is_dir():
        raise InvalidRequest(f"{dst}: is a directory; give the output file's path")
    if dst_p.exists() and not force:
        raise InvalidRequest(f"{dst}: already exists (use --force to overwrite it)")
    if not dst_p.parent.exists():
        raise InvalidRequest(f"{dst}: the folder {dst_p.parent} does not exist")
    return dst_p


def requantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], target: Target,
               keep: list[tuple[str, T]] | None = None, imatrix: Imatrix | None = None, force: bool = False,
               progress: Progress | None = None, extra_kv: dict[str, str | int] | None = None,
               quantizer: BlockQuantizer = quantize) -> list[TensorPlan]:
    """Write `dst` from `src` at `target`; returns the plan it followed. Refuses an existing
    dst unless force (also one created while it writes: the final move never replaces without
    force), and dst == src always. quantizer: the block quantizer of every requantized tensor
    (formats.quants.quantize; the tests and benchmarks pass ggml's to write llama.cpp's bytes)."""
    dst_p = check_output(src, dst, force)
    with GGUFFile(src) as f:
        steps = plan(f, target, keep or [], imatrix is not None)
        tmp = temp_beside(dst_p)
        try:
            w = GGUFWriter(tmp, f.architecture)
            if f.alignment != 32:
                w.add_custom_alignment(f.alignment)
            _copy_kv(f, w)
            w.add_file_type(int(target.file_type))
            w.add_quantization_version(2)
            for key, val in (extra_kv or {}).items():
                if isinstance(val, str):
                    w.add_string(key, val)
                else:
                    w.add_uint32(key, val)
            for p in steps:
                lay = BLOCK_LAYOUTS[p.new_type]
                byte_shape = (*reversed(p.shape[1:]), p.shape[0] // lay.block_size * lay.type_size)
                w.add_tensor_info(p.name, byte_shape, np.dtype(np.uint8), p.new_bytes, raw_dtype=p.new_type)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for p in steps:
                t = f.tensors[p.name]
                data = _quantized_data(t, p.new_type, imatrix, quantizer) if p.requantized else np.asarray(t.data)
                w.write_tensor_data(np.ascontiguousarray(data).reshape(-1))
                if progress is not None:
                    progress(p.name, p.n_elements)
            w.close()
            try:
                commit(tmp, dst_p, overwrite=force)
            except FileExistsError:  # created while we wrote: it is someone else's now
                raise InvalidRequest(f"{dst}: appeared while quantizing and was kept (use --force to overwrite it)") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return steps
