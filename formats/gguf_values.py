"""GGUF's typed values, read through a bounds-checked cursor: the value type ids, the scalars'
little-endian dtypes, strings (u64 length + bytes) and arrays (u32 element type + u64 count +
elements). Every length and count is checked against the bytes that remain before it is
trusted; a failure is a GGUFError naming what was read and its byte offset (Cursor.fail)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from edge_infer.errors import GGUFError


class ValueType:
    """GGUF metadata value type ids."""

    UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL = range(8)
    STRING, ARRAY, UINT64, INT64, FLOAT64 = 8, 9, 10, 11, 12


# value type -> (numpy dtype, size in bytes); strings and arrays are handled apart.
SCALAR_DTYPES: dict[int, np.dtype] = {
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


class Cursor:
    """Bounds-checked little-endian reads over a buffer; every failure names what was read."""

    __slots__ = ("buf", "pos", "size", "path")

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf, self.pos, self.size, self.path = buf, 0, size, path

    def fail(self, what: str, offset: int | None = None) -> GGUFError:
        """The error for `what` at byte `offset` (default: the cursor's position), to raise."""
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


def _read_string_array(cur: Cursor, count: int, what: str) -> list[str]:
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


def _read_array(cur: Cursor, what: str, max_count: int | None) -> list[Any]:
    type_at = cur.pos
    etype = cur.u32(f"element type of {what}")
    count = cur.u64(f"element count of {what}")
    if max_count is not None and count > max_count:  # before anything count-sized is built
        raise cur.fail(f"{what} declares {count} elements, more than the {max_count} allowed")
    if etype == ValueType.ARRAY:
        raise cur.fail(f"{what}: nested arrays are not supported", type_at)
    if etype == ValueType.STRING:
        return _read_string_array(cur, count, what)
    if etype not in SCALAR_DTYPES:
        raise cur.fail(f"{what}: unknown array element type {etype}", type_at)
    dt = SCALAR_DTYPES[etype]
    if count > (cur.size - cur.pos) // dt.itemsize:
        raise cur.fail(f"{what} declares {count} elements of {dt.itemsize} bytes, past the end of the file")
    arr = np.frombuffer(cur.buf, dtype=dt, count=count, offset=cur.pos)
    if etype == ValueType.BOOL and count and int(arr.max()) > 1:
        raise cur.fail(f"{what}[{(i := int(np.argmax(arr > 1)))}]: a boolean must be 0 or 1, got {arr[i]}", cur.pos + i)
    cur.pos += count * dt.itemsize
    return arr.astype(bool).tolist() if etype == ValueType.BOOL else arr.tolist()


def read_value(cur: Cursor, vtype: int, what: str, in_array: bool = False, max_count: int | None = None) -> Any:
    """One value of type `vtype` at the cursor, as a Python int, float, bool, str or list;
    an array longer than max_count elements is refused by its declared count."""
    if vtype in SCALAR_DTYPES:
        dt = SCALAR_DTYPES[vtype]
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
        return _read_array(cur, what, max_count)
    raise cur.fail(f"{what}: unknown value type {vtype}")
