"""Validating, zero-copy GGUF reader (versions 2 and 3).

Layout (little-endian):
    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x   (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml_type, u64 offset)
    padding to `general.alignment` (default 32) | tensor data
    string = u64 length + UTF-8 bytes; array = u32 elem_type + u64 count + elements

Every count and length is checked against the bytes that remain before it is trusted, and
booleans must be 0 or 1, so a malformed file raises GGUFError (naming the field and byte
offset), never a struct/index/unicode/memory error, a hang or a huge allocation; counts that
size a model (layers, widths, the vocabulary's arrays) are capped too (gguf_limits.py).
GGUFFile reads the sections in order with gguf_parse.py's readers, each value through
gguf_values.py's bounds-checked cursor, and views each tensor's bytes in the mapping."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from edge_infer.errors import GGUFError
from edge_infer.formats.gguf_limits import check_hparams
from edge_infer.formats.gguf_parse import (
    read_alignment,
    read_data_offset,
    read_header,
    read_metadata,
    read_tensor_infos,
)
from edge_infer.formats.gguf_values import Cursor, ValueType

__all__ = ["GGUFFile", "GGUFError", "TensorInfo", "ValueType"]


@dataclass(slots=True, eq=False)
class TensorInfo:
    """One tensor: `shape` is in GGUF order (ne[0], the contiguous row length, first);
    `offset` is relative to the data section; `data` is a zero-copy uint8 view of its bytes."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    data: np.ndarray = field(repr=False)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        """Row-major numpy shape of the dequantized tensor (GGUF shape reversed)."""
        return tuple(reversed(self.shape))


class GGUFFile:
    """An opened, fully validated GGUF file; tensor data stays in the OS page cache (mmap).

    Attributes: path, version, alignment, metadata (key -> int | float | bool | str | list),
    metadata_types (key -> value type name, arrays as "array[elem]"), tensors (name ->
    TensorInfo, in file order), data_offset (absolute byte offset of the tensor data section).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        self._mm: mmap.mmap | None = None
        try:
            fd = open(self.path, "rb")
        except FileNotFoundError:
            raise GGUFError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file") from None
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open ({e.strerror})") from None
        with fd:
            size = os.fstat(fd.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{self.path}: truncated file: {size} bytes is smaller than a GGUF header (at byte offset 0)")
            try:
                self._mm = mmap.mmap(fd.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise GGUFError(f"{self.path}: cannot map file ({e})") from None
        self.size = size
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    # -- parsing -------------------------------------------------------------------------
    def _parse(self) -> None:
        assert self._mm is not None  # mapped by __init__ before it parses
        cur = Cursor(self._mm, self.size, self.path)
        self.version, tensor_count, kv_count = read_header(cur)
        self.metadata, self.metadata_types = read_metadata(cur, kv_count)
        check_hparams(self.metadata, self.path)
        self.alignment = read_alignment(self.metadata, self.metadata_types, self.path)
        infos = read_tensor_infos(cur, tensor_count, self.alignment)
        self.data_offset = read_data_offset(cur, infos, self.alignment)
        self.tensors = {
            t.name: TensorInfo(t.name, GGMLQuantizationType(t.ggml_type), t.shape, t.offset, t.nbytes,
                               np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=self.data_offset + t.offset))
            for t in infos
        }

    # -- access --------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata 'general.architecture' is missing or not a string")
        return arch

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called `name`, or GGUFError naming it and the file."""
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name!r}") from None

    def drop_pages(self, t: TensorInfo) -> None:
        """Tell the OS it may drop the resident pages of t's data (after a repacked copy was
        made): they are read back from the file if t is used again. No-op where unsupported."""
        mm = self._mm
        if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = -(-(self.data_offset + t.offset) // page) * page
        end = (self.data_offset + t.offset + t.nbytes) // page * page
        if end > start:
            try:
                mm.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """Release the mapping. If tensor views are still alive the OS mapping lives on
        until they are garbage-collected (numpy holds its own reference)."""
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({Path(self.path).name!r}, v{self.version}, {len(self.tensors)} tensors)"
