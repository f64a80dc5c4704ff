"""GGUF reader: round trips through gguf-py's writer, the real models, and a corrupt-file suite
in which GGUFError must be the only failure."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf_bytes as gb
import numpy as np
import pytest
from conftest import REAL_MODELS, gguf_py_reader, real_model_path
from gguf import GGMLQuantizationType, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_infer.errors import EdgeInferError
from edge_infer.formats.gguf import GGUFError, GGUFFile


def write(tmp_path: Path, data: bytes, name: str = "t.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def writer_file(path: Path) -> Path:
    """A valid file written by gguf-py, with every value type and several tensor types."""
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("v.u8", 200)
    w.add_int8("v.i8", -5)
    w.add_uint16("v.u16", 60000)
    w.add_int16("v.i16", -3000)
    w.add_uint32("v.u32", 4_000_000_000)
    w.add_int32("v.i32", -2_000_000_000)
    w.add_float32("v.f32", 0.1)
    w.add_uint64("v.u64", 2**63 + 5)
    w.add_int64("v.i64", -(2**62))
    w.add_float64("v.f64", 1e-300)
    w.add_bool("v.bool", True)
    w.add_string("v.str", "héllo ✓ 世界")
    w.add_array("v.strs", ["a", "", "ü", "<|im_end|>"])
    w.add_array("v.ints", [1, 2, 3])
    w.add_array("v.floats", [0.5, -2.25])
    w.add_array("v.bools", [True, False])
    w.add_tensor("w.f32", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("w.f16", np.ones((3, 32), dtype=np.float16))
    q8 = np.zeros((2, 34 * 2), dtype=np.uint8)  # two rows of 64 elements = 2 Q8_0 blocks each
    w.add_tensor("w.q8", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_reads_everything_gguf_writer_writes(tmp_path: Path) -> None:
    path = writer_file(tmp_path / "w.gguf")
    with GGUFFile(path) as f:
        assert f.version == 3 and f.alignment == 32
        m = f.metadata
        assert m["general.architecture"] == "llama"
        assert (m["v.u8"], m["v.i8"], m["v.u16"], m["v.i16"]) == (200, -5, 60000, -3000)
        assert (m["v.u32"], m["v.i32"], m["v.u64"], m["v.i64"]) == (4_000_000_000, -2_000_000_000, 2**63 + 5, -(2**62))
        assert m["v.f32"] == float(np.float32(0.1)) and m["v.f64"] == 1e-300 and m["v.bool"] is True
        assert m["v.str"] == "héllo ✓ 世界"
        assert m["v.strs"] == ["a", "", "ü", "<|im_end|>"]
        assert m["v.ints"] == [1, 2, 3] and m["v.floats"] == [0.5, -2.25] and m["v.bools"] == [True, False]
        assert f.metadata_types["v.strs"] == "array[string]" and f.metadata_types["v.u16"] == "uint16"
        assert list(f.tensors) == ["w.f32", "w.f16", "w.q8"]
        t = f.tensors["w.f32"]
        assert t.shape == (32, 2) and t.type == GGMLQuantizationType.F32 and t.nbytes == 256
        assert np.array_equal(t.data.view(np.float32).reshape(t.numpy_shape), np.arange(64, dtype=np.float32).reshape(2, 32))
        assert f.tensors["w.f16"].shape == (32, 3) and f.tensors["w.f16"].nbytes == 192
        q = f.tensors["w.q8"]
        assert q.type == GGMLQuantizationType.Q8_0 and q.shape == (64, 2) and q.nbytes == 136
        assert not t.data.flags.writeable  # a read-only view of the mapping, not a copy


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_match_gguf_py(name: str) -> None:
    path = real_model_path(name)
    ref = gguf_py_reader(path)
    with GGUFFile(path) as f:
        fields = {k: v for k, v in ref.fields.items() if not k.startswith("GGUF.")}
        assert list(f.metadata) == list(fields)
        for key, field in fields.items():
            assert f.metadata[key] == field.contents(), key
        assert [t.name for t in ref.tensors] == list(f.tensors)
        for rt in ref.tensors:
            t = f.tensors[rt.name]
            assert t.type == rt.tensor_type and t.shape == tuple(int(x) for x in rt.shape), rt.name
            assert t.nbytes == rt.n_bytes and t.offset + f.data_offset == rt.data_offset, rt.name
        emb = f.tensors["token_embd.weight"]
        ref_emb = next(t for t in ref.tensors if t.name == "token_embd.weight")
        assert np.array_equal(emb.data, np.asarray(ref_emb.data).view(np.uint8).reshape(-1))


# -- the corrupt-file suite -------------------------------------------------------------------

def _set(data: bytes, at: int, fmt: str, v: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, at, v)
    return bytes(b)


def _bad_cases() -> list[tuple[str, bytes, str]]:
    m = gb.minimal().build()
    cases = [
        ("bad magic", b"GGML" + m[4:], "bad magic"),
        ("version 1", _set(m, 4, "<I", 1), "unsupported GGUF version 1"),
        ("version 99", _set(m, 4, "<I", 99), "unsupported GGUF version 99"),
        ("big endian", _set(m, 4, ">I", 3), "big-endian"),
        ("huge tensor count", _set(m, 8, "<Q", 2**63), "tensor_count"),
        ("huge kv count", _set(m, 16, "<Q", 2**40), "kv_count"),
        ("empty file", b"", "truncated"),
        ("header only", m[:20], "truncated"),
    ]
    # key length past EOF
    cases.append(("key length", _set(m, 24, "<Q", 2**60), "past the end"))

    def raw(mut) -> bytes:  # type: ignore[no-untyped-def]
        r = gb.minimal()
        mut(r)
        return r.build()

    cases += [
        ("nested array", raw(lambda r: r.kv("x.nested", gb.ARR, [[1]], gb.ARR)), "nested arrays"),
        ("unknown value type", raw(lambda r: r.kv("x.bad", 13, b"\0")), "unknown value type 13"),
        ("unknown array element type", raw(lambda r: r.kv("x.arr", gb.ARR, [], 77)), "unknown array element type 77"),
        ("invalid utf-8 key", raw(lambda r: r.kv(b"bad\xff\xfekey", gb.U8, 1)), "not valid UTF-8"),
        ("duplicate key", raw(lambda r: r.kv("x.count", gb.U8, 1)), "duplicate metadata key 'x.count'"),
        ("duplicate tensor", raw(lambda r: r.tensor("a", (4,))), "duplicate tensor name 'a'"),
        ("n_dims 5", raw(lambda r: r.tensor("c", (1, 1, 1, 1, 1))), "n_dims 5"),
        ("zero dim", raw(lambda r: r.tensor("c", (4, 0), data=b"")), "dimension 1 is 0"),
        ("negative dim", raw(lambda r: r.tensor("c", (2**64 - 4,), data=b"")), "must be positive"),
        ("element overflow", raw(lambda r: r.tensor("c", (2**31, 2**31, 2**31), data=b"")), "overflows"),
        ("unknown tensor type", raw(lambda r: r.tensor("c", (32,), ggml_type=4, data=b"\0" * 32)), "unknown tensor type 4"),
        ("row not a block multiple", raw(lambda r: r.tensor("c", (33,), ggml_type=8, data=b"\0" * 34)), "not a multiple"),
        ("alignment not power of two", raw(lambda r: r.kvs.__setitem__(1, ("general.alignment", gb.U32, 24, None))),
         "power-of-two"),
        ("alignment zero", raw(lambda r: r.kvs.__setitem__(1, ("general.alignment", gb.U32, 0, None))), "power-of-two"),
        ("alignment wrong type", raw(lambda r: r.kvs.__setitem__(1, ("general.alignment", gb.U64, 32, None))),
         "power-of-two"),
        ("data outside file", raw(lambda r: r.tensor("c", (8,), offset=1 << 20)), "outside"),
        ("overlap", raw(lambda r: r.tensor("c", (8,), offset=0)), "overlaps"),
        ("misaligned offset", raw(lambda r: r.tensor("c", (2,), offset=36)), "not a multiple of the alignment"),
        ("string array count", raw(lambda r: r.kv("x.many", gb.ARR, [], gb.STR)).replace(
            struct.pack("<Q", 6) + b"x.many" + struct.pack("<IIQ", gb.ARR, gb.STR, 0),
            struct.pack("<Q", 6) + b"x.many" + struct.pack("<IIQ", gb.ARR, gb.STR, 2**62)), "more than the file"),
        ("boolean 7", raw(lambda r: r.kv("x.flag", gb.BOOL, True)).replace(
            b"x.flag" + struct.pack("<I", gb.BOOL) + b"\x01", b"x.flag" + struct.pack("<I", gb.BOOL) + b"\x07"),
         "x.flag': a boolean must be 0 or 1, got 7"),
        ("boolean array 2", raw(lambda r: r.kv("x.flags", gb.ARR, [True, False, True], gb.BOOL)).replace(
            b"\x01\x00\x01", b"\x01\x00\x02"), "[2]: a boolean must be 0 or 1, got 2"),
        ("numeric array count", raw(lambda r: r.kv("x.many", gb.ARR, [], gb.U8)).replace(
            struct.pack("<Q", 6) + b"x.many" + struct.pack("<IIQ", gb.ARR, gb.U8, 0),
            struct.pack("<Q", 6) + b"x.many" + struct.pack("<IIQ", gb.ARR, gb.U8, 2**40)), "past the end"),
    ]
    return cases


@pytest.mark.parametrize(("what", "data", "message"), _bad_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_malformed_files_raise_gguf_error_naming_the_problem(tmp_path: Path, what: str, data: bytes, message: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(GGUFError) as e:
        GGUFFile(path)
    assert message in str(e.value)
    assert str(path) in str(e.value)
    assert "byte offset" in str(e.value) or "alignment" in str(e.value)
    assert isinstance(e.value, EdgeInferError)


def test_minimal_file_is_valid(tmp_path: Path) -> None:
    with GGUFFile(write(tmp_path, gb.minimal().build())) as f:
        assert f.metadata["x.names"] == ["a", "bc", ""] and list(f.tensors) == ["a", "b"]
        assert f.tensors["b"].data.view(np.float32).tolist() == list(range(8))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile(tmp_path)


def test_value_strings_that_are_not_utf8_survive_losslessly(tmp_path: Path) -> None:
    data = gb.minimal().kv("x.tok", gb.ARR, [b"\xe4\xb8", b"ok"], gb.STR).build()
    with GGUFFile(write(tmp_path, data)) as f:
        assert [s.encode("utf-8", "surrogateescape") for s in f.metadata["x.tok"]] == [b"\xe4\xb8", b"ok"]


@pytest.mark.parametrize("source", ["minimal", "writer"])
def test_truncation_at_every_byte_raises_gguf_error(tmp_path: Path, source: str) -> None:
    full = gb.minimal().build() if source == "minimal" else writer_file(tmp_path / "w.gguf").read_bytes()
    path = write(tmp_path, full, "cut.gguf")
    with GGUFFile(path) as f:  # trailing padding after the last tensor may go; nothing else may
        end = f.data_offset + max(t.offset + t.nbytes for t in f.tensors.values())
    for n in range(end):
        path.write_bytes(full[:n])
        with pytest.raises(GGUFError):
            GGUFFile(path)


def _check_corrupt(tmp_path: Path, data: bytes) -> None:
    path = write(tmp_path, data, "fuzz.gguf")
    try:
        f = GGUFFile(path)
    except GGUFError:
        return
    # What parses must be internally consistent: every tensor view lies inside the file.
    for t in f.tensors.values():
        assert t.data.nbytes == t.nbytes and f.data_offset + t.offset + t.nbytes <= len(data)
    f.close()


_WRITER_BYTES: dict[str, bytes] = {}


def _writer_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if "b" not in _WRITER_BYTES:
        _WRITER_BYTES["b"] = writer_file(tmp_path_factory.mktemp("w") / "w.gguf").read_bytes()
    return _WRITER_BYTES["b"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_only_ever_raises_gguf_error(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    base = bytearray(_writer_bytes(tmp_path_factory))
    n_edits = data.draw(st.integers(1, 4))
    for _ in range(n_edits):
        kind = data.draw(st.sampled_from(["byte", "u32", "u64", "truncate"]))
        if kind == "truncate":
            base = base[: data.draw(st.integers(0, len(base)))]
            continue
        width = {"byte": 1, "u32": 4, "u64": 8}[kind]
        if len(base) < width:
            continue
        at = data.draw(st.integers(0, len(base) - width))
        special = [0, 1, 2**(8 * width) - 1, 2**(8 * width - 1), 13, 9, 8, 5]
        v = data.draw(st.one_of(st.sampled_from(special), st.integers(0, 2**(8 * width) - 1)))
        base[at : at + width] = v.to_bytes(width, "little")
    _check_corrupt(tmp_path_factory.mktemp("c"), bytes(base))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 4096), junk=st.binary(max_size=64))
def test_corruption_at_section_boundaries(tmp_path_factory: pytest.TempPathFactory, cut: int, junk: bytes) -> None:
    full = _writer_bytes(tmp_path_factory)
    with GGUFFile(write(tmp_path_factory.mktemp("s"), full)) as f:
        # boundaries: header, each kv start, tensor infos, data section
        boundaries = [0, 4, 8, 16, 24, f.data_offset] + [f.data_offset + t.offset for t in f.tensors.values()]
    at = boundaries[cut % len(boundaries)]
    _check_corrupt(tmp_path_factory.mktemp("c"), full[:at] + junk + full[at + len(junk):])
