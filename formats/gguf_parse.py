"""The sections of a GGUF file, each read by one function in file order (as gguf-py's reader
builds them): the header, the metadata key/values, the alignment they declare, the tensor
infos, and the data section's start and spans. Each checks what it reads against the bytes
that remain and raises GGUFError naming the field and its byte offset (gguf_values.Cursor)."""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from edge_infer.errors import GGUFError
from edge_infer.formats.gguf_limits import array_limit
from edge_infer.formats.gguf_values import VALUE_TYPE_NAMES, Cursor, ValueType, read_value

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_DIM = 1 << 62  # a dimension above this is a corrupt (or "negative" int64) value
_KNOWN_GGML_TYPES = {int(t) for t in GGMLQuantizationType}


class RawTensor(NamedTuple):
    """A tensor info as read: offset relative to the data section, nbytes its data's size,
    info_at the byte offset of its offset field (where a bad span is reported)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    info_at: int


def read_header(cur: Cursor) -> tuple[int, int, int]:
    """magic | u32 version | u64 tensor_count | u64 kv_count -> (version, tensor_count,
    kv_count), the counts held to what the rest of the file could hold."""
    magic = bytes(cur.buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.fail(f"bad magic {magic!r}, expected b'GGUF': not a GGUF file", 0)
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFFFF == 0 and (version >> 24) in (2, 3):
            raise cur.fail("big-endian GGUF files are not supported", 4)
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
    tensor_count = cur.u64("tensor_count")
    kv_count = cur.u64("kv_count")
    # Smallest possible kv: 8 (key length) + 4 (type) + 1 (u8 value); tensor info: 8+4+4+8.
    if kv_count > (cur.size - cur.pos) // 13:
        raise cur.fail(f"kv_count {kv_count} cannot fit in a {cur.size}-byte file", 16)
    if tensor_count > (cur.size - cur.pos) // 24:
        raise cur.fail(f"tensor_count {tensor_count} cannot fit in a {cur.size}-byte file", 8)
    return version, tensor_count, kv_count


def read_metadata(cur: Cursor, kv_count: int) -> tuple[dict[str, Any], dict[str, str]]:
    """kv_count x (string key, u32 value type, value) -> (key -> value, key -> type name, an
    array's as "array[elem]"); keys must be unique, the tokenizer's arrays within array_limit."""
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
        if vtype == ValueType.ARRAY and cur.pos + 4 <= cur.size:
            (et,) = struct.unpack_from("<I", cur.buf, cur.pos)
            tname = f"array[{VALUE_TYPE_NAMES.get(et, et)}]"
        metadata[key] = read_value(cur, vtype, f"metadata {key!r}", max_count=array_limit(key))
        types[key] = tname
    return metadata, types


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def read_alignment(metadata: dict[str, Any], types: dict[str, str], path: str) -> int:
    """general.alignment (DEFAULT_ALIGNMENT when absent): a power-of-two uint32, in bytes."""
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if types.get("general.alignment", "uint32") != "uint32" or not _is_power_of_two(alignment):
        raise GGUFError(f"{path}: general.alignment must be a power-of-two uint32, got {alignment!r}")
    return alignment


def _read_shape(cur: Cursor, name: str) -> tuple[tuple[int, ...], int, int]:
    """u32 n_dims, n_dims x u64 ne -> (shape, element count, byte offset of ne[0])."""
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
    return shape, n_el, dims_at


def _read_tensor_info(cur: Cursor, name: str, alignment: int) -> RawTensor:
    """The rest of one tensor info after its name: shape, u32 ggml type, u64 data offset."""
    shape, n_el, dims_at = _read_shape(cur, name)
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
    return RawTensor(name, ggml_type, shape, offset, n_el // block * type_size, off_at)


def read_tensor_infos(cur: Cursor, tensor_count: int, alignment: int) -> list[RawTensor]:
    """tensor_count x (string name, shape, type, offset), in file order; names must be unique."""
    infos: list[RawTensor] = []
    names: set[str] = set()
    for i in range(tensor_count):
        at = cur.pos
        name = cur.utf8_string(f"name of tensor #{i}")
        if name in names:
            raise cur.fail(f"duplicate tensor name {name!r}", at)
        names.add(name)
        infos.append(_read_tensor_info(cur, name, alignment))
    return infos


def read_data_offset(cur: Cursor, infos: list[RawTensor], alignment: int) -> int:
    """The absolute byte offset of the tensor data section (the cursor's position after the
    infos, aligned up), with every tensor's data checked to lie inside the file, none overlapping."""
    data_offset = (cur.pos + alignment - 1) // alignment * alignment
    if infos and data_offset > cur.size:
        raise cur.fail("truncated file: tensor data section starts past the end of the file")
    spans = sorted((t.offset, t.offset + t.nbytes, t.name, t.info_at) for t in infos)
    prev_end, prev_name = 0, ""
    for start, end, name, at in spans:
        if data_offset + end > cur.size:
            raise cur.fail(
                f"tensor {name!r}: data [{data_offset + start}, {data_offset + end}) lies outside the "
                f"{cur.size}-byte file",
                at,
            )
        if start < prev_end:
            raise cur.fail(f"tensor {name!r} overlaps tensor {prev_name!r} in the data section", at)
        prev_end, prev_name = end, name
    return data_offset
