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
size a model (layers, widths, the vocabulary's arrays) are capped too (gguf_limits.py)."""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edge_infer.errors import GGUFError
from edge_infer.formats.gguf_limits import array_limit, check_hparams

__all__ = ["GGUFFile", "GGUFError", "TensorInfo", "ValueType"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_DIM = 1 << 62  # a dimension above this is a corrupt (or "negative" int64) value


class ValueType:
    """GGUF metadata value type ids."""

    UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL = range(8)
    STRING, ARRAY, UINT64, INT64, FLOAT64 = 8, 9, 10, 11, 12


# value type -> (numpy dtype, size in bytes); strings and arrays are handled apart.
_SCALAR_DTYPES: dict[int, np.dtype] = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("<u1"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}
VALUE_TYPE_NAMES = {v: k.lower() for k, v in vars(ValueType).items() if k.isupper()}  # 0 -> "uint8", ...
_KNOWN_GGML_TYPES = {int(t) for t in GGMLQuantizationType}


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


class _Cursor:
    """Bounds-checked little-endian reads over a buffer; every failure names what was read."""

    __slots__ = ("buf", "pos", "size", "path")

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf, self.pos, self.size, self.path = buf, 0, size, path

    def fail(self, what: str, offset: int | None = None) -> GGUFError:
        at = self.pos if offset is None else offset
        return GGUFError(f"{self.path}: {what} (at byte offset {at})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated file: {what} needs {n} bytes, {self.size - self.pos} remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = struct.unpack_from("<I", self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = struct.unpack_from("<Q", self.buf, self.pos)
        self.pos += 8
        return v

    def raw_string(self, what: str) -> bytes:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what} declares length {n}, past the end of the file", start)
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b

    def utf8_string(self, what: str) -> str:
        start = self.pos
        b = self.raw_string(what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})", start) from None


def _decode_value_string(b: bytes) -> str:
    # Values (token texts above all) may hold bytes that are not UTF-8 in some converted
    # models; surrogateescape keeps them losslessly: s.encode("utf-8", "surrogateescape").
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b.decode("utf-8", "surrogateescape")


def _read_string_array(cur: _Cursor, count: int, what: str) -> list[str]:
    # Each element is u64 length + bytes; lengths are interleaved, so walk them once with
    # unpack_from (no per-element numpy objects, which is what makes gguf-py slow).
    buf, pos, size = cur.buf, cur.pos, cur.size
    if count > (size - pos) // 8:
        raise cur.fail(f"{what} declares {count} strings, more than the file can hold")
    unpack = struct.Struct("<Q").unpack_from
    out: list[str] = []
    append = out.append
    for i in range(count):
        if pos + 8 > size:
            raise cur.fail(f"truncated file: length of {what}[{i}] past the end", pos)
        (n,) = unpack(buf, pos)
        pos += 8
        if n > size - pos:
            raise cur.fail(f"{what}[{i}] declares length {n}, past the end of the file", pos - 8)
        append(_decode_value_string(buf[pos : pos + n]))
        pos += n
    cur.pos = pos
    return out


def _read_value(cur: _Cursor, vtype: int, what: str, in_array: bool = False, max_count: int | None = None) -> Any:
    if vtype in _SCALAR_DTYPES:
        dt = _SCALAR_DTYPES[vtype]
        cur.need(dt.itemsize, what)
        v = np.frombuffer(cur.buf, dtype=dt, count=1, offset=cur.pos)[0].item()
        if vtype == ValueType.BOOL and v > 1:
            raise cur.fail(f"{what}: a boolean must be 0 or 1, got {v}")
        cur.pos += dt.itemsize
        return bool(v) if vtype == ValueType.BOOL else v
    if vtype == ValueType.STRING:
        return _decode_value_string(cur.raw_string(what))
    if vtype == ValueType.ARRAY:
        if in_array:
            raise cur.fail(f"{what}: nested arrays are not supported")
        type_at = cur.pos
        etype = cur.u32(f"element type of {what}")
        count = cur.u64(f"element count of {what}")
        if max_count is not None and count > max_count:  # before anything count-sized is built
            raise cur.fail(f"{what} declares {count} elements, more than the {max_count} allowed")
        if etype == ValueType.ARRAY:
            raise cur.fail(f"{what}: nested arrays are not supported", type_at)
        if etype == ValueType.STRING:
            return _read_string_array(cur, count, what)
        if etype not in _SCALAR_DTYPES:
            raise cur.fail(f"{what}: unknown array element type {etype}", type_at)
        dt = _SCALAR_DTYPES[etype]
        if count > (cur.size - cur.pos) // dt.itemsize:
            raise cur.fail(f"{what} declares {count} elements of {dt.itemsize} bytes, past the end of the file")
        arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos)
        if etype == ValueType.BOOL and count and int(arr.max()) > 1:
            raise cur.fail(f"{what}[{(i := int(np.argmax(arr > 1)))}]: a boolean must be 0 or 1, got {arr[i]}", cur.pos + i)
        cur.pos += count * dt.itemsize
        return arr.astype(bool).tolist() if etype == ValueType.BOOL else arr.tolist()
    raise cur.fail(f"{what}: unknown value type {vtype}")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


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
        cur = _Cursor(self._mm, self.size, self.path)
        magic = bytes(self._mm[0:4])
        if magic != GGUF_MAGIC:
            raise cur.fail(f"bad magic {magic!r}, expected b'GGUF': not a GGUF file", 0)
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFFFF == 0 and (version >> 24) in (2, 3):
                raise cur.fail("big-endian GGUF files are not supported", 4)
            raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
        self.version = version
        tensor_count = cur.u64("tensor_count")
        kv_count = cur.u64("kv_count")
        # Smallest possible kv: 8 (key length) + 4 (type) + 1 (u8 value); tensor info: 8+4+4+8.
        if kv_count > (self.size - cur.pos) // 13:
            raise cur.fail(f"kv_count {kv_count} cannot fit in a {self.size}-byte file", 16)
        if tensor_count > (self.size - cur.pos) // 24:
            raise cur.fail(f"tensor_count {tensor_count} cannot fit in a {self.size}-byte file", 8)

        metadata: dict[str, Any] = {}
        types: dict[str, str] = {}
        for i in range(kv_count):
            key_at = cur.pos
            key = cur.utf8_string(f"metadata key #{i}")
            if key in metadata:
                raise cur.fail(f"duplicate metadata key {key!r}", key_at)
            vt_at = cur.pos
            vtype = cur.u32(f"value type of {key!r}")
            if vtype not in VALUE_TYPE_NAMES:
                raise cur.fail(f"metadata {key!r}: unknown value type {vtype}", vt_at)
            tname = VALUE_TYPE_NAMES[vtype]
            if vtype == ValueType.ARRAY and cur.pos + 4 <= self.size:
                (et,) = struct.unpack_from("<I", self._mm, cur.pos)
                tname = f"array[{VALUE_TYPE_NAMES.get(et, et)}]"
            metadata[key] = _read_value(cur, vtype, f"metadata {key!r}", max_count=array_limit(key))
            types[key] = tname
        check_hparams(metadata, self.path)
        self.metadata = metadata
        self.metadata_types = types

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if types.get("general.alignment", "uint32") != "uint32" or not _is_power_of_two(alignment):
            raise GGUFError(f"{self.path}: general.alignment must be a power-of-two uint32, got {alignment!r}")
        self.alignment = alignment

        infos: list[tuple[str, int, tuple[int, ...], int, int, int]] = []
        names: set[str] = set()
        for i in range(tensor_count):
            at = cur.pos
            name = cur.utf8_string(f"name of tensor #{i}")
            if name in names:
                raise cur.fail(f"duplicate tensor name {name!r}", at)
            names.add(name)
            nd_at = cur.pos
            n_dims = cur.u32(f"n_dims of tensor {name!r}")
            if n_dims == 0 or n_dims > MAX_DIMS:
                raise cur.fail(f"tensor {name!r}: n_dims {n_dims} is outside 1..{MAX_DIMS}", nd_at)
            dims_at = cur.pos
            shape = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
            for d, ne in enumerate(shape):
                if ne == 0 or ne > MAX_DIM:
                    raise cur.fail(f"tensor {name!r}: dimension {d} is {ne}, must be positive", dims_at + 8 * d)
            n_el = 1
            for ne in shape:
                n_el *= ne
            if n_el > MAX_DIM:
                raise cur.fail(f"tensor {name!r}: element count {n_el} overflows", dims_at)
            type_at = cur.pos
            ggml_type = cur.u32(f"type of tensor {name!r}")
            if ggml_type not in _KNOWN_GGML_TYPES:
                raise cur.fail(f"tensor {name!r}: unknown tensor type {ggml_type}", type_at)
            qtype = GGMLQuantizationType(ggml_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
            if shape[0] % block != 0:
                raise cur.fail(
                    f"tensor {name!r}: row length {shape[0]} is not a multiple of the {qtype.name} block size {block}",
                    dims_at,
                )
            off_at = cur.pos
            offset = cur.u64(f"data offset of tensor {name!r}")
            if offset % alignment != 0:
                raise cur.fail(f"tensor {name!r}: data offset {offset} is not a multiple of the alignment {alignment}", off_at)
            nbytes = n_el // block * type_size
            infos.append((name, ggml_type, shape, offset, nbytes, off_at))

        data_offset = (cur.pos + alignment - 1) // alignment * alignment
        if tensor_count and data_offset > self.size:
            raise cur.fail("truncated file: tensor data section starts past the end of the file")
        self.data_offset = data_offset

        # Tensor data must lie inside the file and must not overlap.
        spans = sorted((off, off + nb, name, at) for name, _, _, off, nb, at in infos)
        prev_end, prev_name = 0, ""
        for start, end, name, at in spans:
            if data_offset + end > self.size:
                raise cur.fail(
                    f"tensor {name!r}: data [{data_offset + start}, {data_offset + end}) lies outside the "
                    f"{self.size}-byte file",
                    at,
                )
            if start < prev_end:
                raise cur.fail(f"tensor {name!r} overlaps tensor {prev_name!r} in the data section", at)
            prev_end, prev_name = end, name

        tensors: dict[str, TensorInfo] = {}
        for name, ggml_type, shape, offset, nbytes, _ in infos:
            data = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes, offset=data_offset + offset)
            tensors[name] = TensorInfo(name, GGMLQuantizationType(ggml_type), shape, offset, nbytes, data)
        self.tensors = tensors

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
