"""Build GGUF files byte by byte, so tests can write exactly the malformed file they need."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

# value type ids (GGUF spec)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
         U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype: int, v: object, etype: int | None = None) -> bytes:
    if vtype == STR:
        return gstr(v)  # type: ignore[arg-type]
    if vtype == ARR:
        items = list(v)  # type: ignore[call-overload]
        inner = U8 if etype == ARR else etype  # nested arrays: inner arrays of u8
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x, inner) for x in items)
    if vtype not in _PACK:  # an unknown type id: the caller gives the raw bytes
        return bytes(v)  # type: ignore[call-overload]
    return struct.pack(_PACK[vtype], v)


@dataclass
class RawTensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int = 0  # F32
    offset: int | None = None  # None: packed after the previous one, aligned
    data: bytes = b""


@dataclass
class RawGGUF:
    """A GGUF file as plain parts; `build()` lays them out, tests then poke at the bytes."""

    kvs: list[tuple[str | bytes, int, object, int | None]] = field(default_factory=list)
    tensors: list[RawTensor] = field(default_factory=list)
    version: int = 3
    alignment: int = 32
    magic: bytes = b"GGUF"
    tensor_count: int | None = None
    kv_count: int | None = None

    def kv(self, key: str | bytes, vtype: int, v: object, etype: int | None = None) -> RawGGUF:
        self.kvs.append((key, vtype, v, etype))
        return self

    def tensor(self, name: str, shape: tuple[int, ...], ggml_type: int = 0, data: bytes | None = None,
               offset: int | None = None) -> RawGGUF:
        if data is None:
            n = int(np.prod(shape))
            data = np.arange(n, dtype=np.float32).tobytes() if ggml_type == 0 else b"\0" * n
        self.tensors.append(RawTensor(name, shape, ggml_type, offset, data))
        return self

    def build(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<I", self.version))
        tc = len(self.tensors) if self.tensor_count is None else self.tensor_count
        kc = len(self.kvs) if self.kv_count is None else self.kv_count
        out += struct.pack("<QQ", tc, kc)
        for key, vt, v, et in self.kvs:
            out += gstr(key) + struct.pack("<I", vt) + value(vt, v, et)
        offsets, pos = [], 0
        for t in self.tensors:
            if t.offset is not None:  # explicit offsets do not grow the data section
                offsets.append(t.offset)
                continue
            offsets.append(pos)
            pos = (pos + len(t.data) + self.alignment - 1) // self.alignment * self.alignment
        for t, off in zip(self.tensors, offsets, strict=False):
            out += gstr(t.name) + struct.pack("<I", len(t.shape))
            out += b"".join(struct.pack("<Q", d) for d in t.shape)
            out += struct.pack("<IQ", t.ggml_type, off)
        data_start = (len(out) + self.alignment - 1) // self.alignment * self.alignment
        out += b"\0" * (data_start - len(out))
        blob = bytearray(pos)
        for t, off in zip(self.tensors, offsets, strict=False):
            if off + len(t.data) <= len(blob):
                blob[off : off + len(t.data)] = t.data
        return bytes(out + blob)


def minimal() -> RawGGUF:
    """A small valid file: a few kvs of several types and two F32 tensors."""
    return (
        RawGGUF()
        .kv("general.architecture", STR, "llama")
        .kv("general.alignment", U32, 32)
        .kv("x.count", U64, 7)
        .kv("x.names", ARR, ["a", "bc", ""], STR)
        .kv("x.scores", ARR, [0.5, -1.0], F32)
        .tensor("a", (4, 2))
        .tensor("b", (8,))
    )
