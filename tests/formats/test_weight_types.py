"""formats.weight_types: each record agrees with gguf-py, every table derived from the records
agrees with them, the per-type function tables cover exactly the types the records say, and
every form a record names round-trips: the reference quantizer's bytes, repacked into the int8,
K-quant and CUDA forms, decode to the reference dequantizer's values bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from support.quant_helpers import random_blocks

from edge_infer.errors import UnsupportedTensorType
from edge_infer.formats import quant_policy, quants, weight_types
from edge_infer.formats.quantizers import QUANTIZERS
from edge_infer.formats.quantizers_weighted import WEIGHTED_QUANTIZERS
from edge_infer.formats.weight_types import TYPES, WeightType, by_name, weight_type
from edge_infer.kernels_cpu import (
    backend,
    dequant,
    reference,
    repack_i8,
    repack_k,
    simd_dot,
    simd_isa,
    target,
)
from edge_infer.kernels_cuda import layout

ROWS, COLS = 19, 512  # a short 16-row group; two super-blocks, sixteen 32-blocks per row
QUANTIZED = [t for t in TYPES if t.family != "float"]


def ids(pred: object) -> set[int]:
    return {t.id for t in TYPES if pred(t)}  # type: ignore[operator]


def name(t: WeightType) -> str:
    return t.name


# -- the records ------------------------------------------------------------------------------
@pytest.mark.parametrize("t", TYPES, ids=name)
def test_record_matches_gguf(t: WeightType) -> None:
    assert T(t.id).name == t.name
    assert GGML_QUANT_SIZES[T(t.id)] == (t.block_size, t.type_size)
    assert t.dtype.itemsize == t.type_size
    assert getattr(weight_types, t.name) == t.id  # the module's int constant
    assert {"float": 1, "legacy": 32, "k": 256}[t.family] == t.block_size
    assert weight_type(t.id) is weight_type(T(t.id)) is by_name(t.name.lower()) is t


def test_records_are_consistent() -> None:
    from edge_infer.formats.quants_iq import grid as grid_values

    assert len({t.id for t in TYPES}) == len({t.name for t in TYPES}) == len(TYPES)
    for t in TYPES:
        if t.i8 is not None:  # 16 rows x 32 columns of 8-bit, 4-bit or 5-bit codes (a table's: 4-bit)
            nbits = 8 if t.i8.zero is None and t.i8.table is None else 4 + t.i8.fifth_bit
            assert t.family == "legacy" and t.i8.block_bytes == 16 * 32 * nbits // 8, t.name
            assert t.i8.has_min == ("m" in t.dtype.names) and t.i8.fifth_bit == ("qh" in t.dtype.names)
            assert set(t.i8.roles) <= {"layer", "output"}
        for table in (t.i8 and t.i8.table, t.k and t.k.table):  # 16 int8 values of 4-bit codes
            assert table is None or (len(table) == 16 and all(-128 <= v <= 127 for v in table)), t.name
        if t.i8 is not None and t.i8.table is not None:  # read as signed codes, no min, no fifth bit
            assert t.i8.zero is None and not t.i8.has_min and not t.i8.fifth_bit
        if t.k is not None and t.k.table is not None:
            assert t.k.bits == 4 and not t.k.has_min
        if t.k is not None:  # the file's bytes of 16 rows, as header + 8 blocks (IQ4_XS: + its 8-bit scales,
            # 8 per row for 6 packed bytes; TQ1_0: its base-3 digits as 2 bits; the grid types with 7
            # stored sign bits per 8 columns: the eighth; IQ1_S: a delta sign per 8 columns, not 32,
            # and 4-bit scales; IQ1_M: 4-bit scales; Q4_K, Q5_K: their 6-bit scales and mins as bytes)
            seventh = 16 * 256 // 8 // 8  # bytes of 16 rows' eighth sign bits
            extra = {weight_types.IQ4_XS: 16 * 8 - 16 * 6, weight_types.TQ1_0: 16 * 64 - 16 * 52,
                     weight_types.Q4_K: 16 * 16 - 16 * 12, weight_types.Q5_K: 16 * 16 - 16 * 12,
                     weight_types.IQ2_XXS: seventh, weight_types.IQ2_XS: seventh,
                     weight_types.IQ3_XXS: seventh, weight_types.IQ1_S: 16 * 8 * (3 + 1) // 8,
                     weight_types.IQ1_M: 16 * 16 // 8}.get(t.id, 0)
            assert t.family == "k" and t.k.record_bytes == 16 * t.type_size + extra, t.name
            if t.k.grid is None:
                assert t.k.block_bytes == 16 * 32 * t.k.bits // 8
            else:  # signed grid values + 128 as 8-bit codes; d, then the 4-bit scales of 16 rows
                g = t.k.grid
                assert t.k.bits == 8 and t.k.table is None and g.width in (4, 8)
                assert 8 <= g.index_bits <= 10 if g.signed else g.index_bits == 12
                assert t.k.header_bytes == 32 + 16 * (256 // g.scale_cols) // 2
                assert (g.width, g.index_bits) == (grid_values(g.name).shape[1], grid_values(g.name).shape[0].bit_length() - 1)
            assert t.k.record_bytes == t.k.header_bytes + 8 * t.k.block_bytes
            assert t.k.has_min == ("dmin" in t.dtype.names)
        assert t.cuda.kind in ("codes", "nibbles", "float")
        if t.cuda.kind != "float":  # the CUDA codes come from the CPU forms' integer views
            assert (t.i8 is None) != (t.k is None), t.name
        if t.cuda.kind == "nibbles":
            assert t.i8 is None or t.i8.zero == t.cuda.nibble_offset
        if t.fallback is not None:
            fb = weight_type(t.fallback)
            assert t.family == "k" and fb.block_size == 32 and fb.quantizer
        assert not t.weighted or t.quantizer
        assert not t.needs_importance or t.quantizer


def test_lookup_errors_name_the_type() -> None:
    with pytest.raises(UnsupportedTensorType, match=r"load: type NVFP4 is not supported \(supported: F32"):
        weight_type(T.NVFP4, "load")
    with pytest.raises(UnsupportedTensorType, match="9999 \\(unknown\\)"):
        weight_type(9999)
    with pytest.raises(UnsupportedTensorType, match="'Q9_9'"):
        by_name("Q9_9")


# -- the tables: function tables cover the records' capabilities, data tables are derived ------
def test_function_tables_cover_the_records() -> None:
    assert {int(k) for k in quants._DEQUANT} == ids(lambda t: t.family != "float")
    assert {int(k) for k in QUANTIZERS} == ids(lambda t: t.quantizer)
    assert {int(k) for k in WEIGHTED_QUANTIZERS} == ids(lambda t: t.weighted)


def test_derived_tables_agree() -> None:
    assert quants.BLOCK_LAYOUTS == {T(t.id): t for t in TYPES}
    assert set(quants.SUPPORTED_TYPES) == ids(lambda t: True)
    assert dequant.KERNEL_TYPES == tuple(t.id for t in TYPES)
    assert dequant.BLOCK_SHAPE == {t.id: (t.block_size, t.type_size) for t in TYPES}
    for t in TYPES:  # the ids the kernels dispatch on
        assert getattr(dequant, t.name) == t.id
    signed = 0 if simd_isa.SIGNED_EIGHT else 128
    assert repack_i8.I8_FORMATS == {t.id: (t.i8.block_bytes, signed if t.i8.zero is None else t.i8.zero)
                                    for t in TYPES if t.i8 is not None}
    assert set(repack_i8.WITH_MIN) == ids(lambda t: t.i8 is not None and t.i8.has_min)
    assert repack_k.K_FORMATS == {t.id: (t.k.record_bytes, t.k.bits, t.k.header_bytes) for t in TYPES if t.k}
    assert repack_k.FILE_BYTES == {t.id: t.type_size for t in TYPES if t.k is not None}
    for role in ("layer", "output"):
        assert set(backend.I8_TYPES[role]) == ids(lambda t, r=role: t.i8 is not None and r in t.i8.roles)
    assert set(backend.K_TYPES) == ids(lambda t: t.k is not None)
    assert set(target.matmul_paths()) == {t.name for t in TYPES}
    assert quant_policy.FALLBACK == {T(t.id): T(t.fallback) for t in TYPES if t.fallback is not None}
    for t in TYPES:
        assert quant_policy.block_size(T(t.id)) == t.block_size
    assert set(layout.CODE_TYPES) == ids(lambda t: t.cuda.kind != "float")
    assert layout.NIBBLE_OFFSET == {t.id: t.cuda.nibble_offset for t in TYPES if t.cuda.kind == "nibbles"}


# -- the forms round-trip ----------------------------------------------------------------------
def _data(t: WeightType) -> tuple[np.ndarray, np.ndarray]:
    """A matrix quantized by the reference quantizer (uint8 [ROWS, row_bytes]; random codes for
    a type read but not written) and its reference dequantization (float32 [ROWS, COLS])."""
    rng = np.random.default_rng(t.id)
    if t.quantizer:
        imp = rng.random(COLS).astype(np.float32) if t.needs_importance else None
        raw = quants.quantize((rng.standard_t(5, (ROWS, COLS)) * 0.05).astype(np.float32), T(t.id), imp)
    else:
        raw = random_blocks(rng, t.id, ROWS * COLS // t.block_size).reshape(ROWS, -1)
    return raw, quants.dequantize_blocks(raw, T(t.id), ROWS * COLS).reshape(ROWS, COLS)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def rows(a: np.ndarray, lane_axis: int) -> np.ndarray:
    """A repacked array [G, X, ..., 16 (lane), ...] -> [ROWS, X, rest flattened]: the row of
    group g and lane l is 16 g + l."""
    a = np.moveaxis(a, lane_axis, 1)
    return a.reshape(a.shape[0] * 16, a.shape[2], -1)[:ROWS]


def f16_bits(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("t", [t for t in TYPES if t.family == "float"], ids=name)
def test_float_types_round_trip(t: WeightType) -> None:
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    raw = quants.quantize(x, T(t.id))
    want = {"F32": x, "F16": x.astype(np.float16).astype(np.float32)}.get(t.name)
    if want is None:  # BF16: the top half of each float32, rounded to nearest even
        want = quants.dequantize_blocks(raw, T(t.id), x.size).reshape(x.shape)
        assert np.all(np.abs(want - x) <= np.abs(x) * 2.0**-8)
    assert np.array_equal(bits(quants.dequantize_blocks(raw, T(t.id), x.size).reshape(x.shape)), bits(want))


def _unpack_i8(iw: repack_i8.I8Weights, fifth: bool) -> np.ndarray:
    """The int8 layout's codes back in row and column order: int64 [ROWS, nb, 32]."""
    g, nb = iw.wi.shape[:2]
    n = 512 if iw.wi.shape[2] == 512 else 256  # the code bytes: 8 quads of 8-bit codes, or 4 of nibble pairs
    quads = iw.wi[:, :, :n].reshape(g, nb, n // 64, 16, 4)  # [g, b, quad, lane, k]
    if n == 512:  # 8-bit: quad q holds columns 4q..4q+3
        codes = quads.transpose(0, 3, 1, 2, 4).reshape(g * 16, nb, 32).astype(np.int64)
    else:  # 4-bit: byte 4q + k holds column 4q + k (low nibble) and 16 + 4q + k (high)
        byte = quads.transpose(0, 3, 1, 2, 4).reshape(g * 16, nb, 16).astype(np.int64)
        codes = np.concatenate([byte & 15, byte >> 4], axis=-1)
    if fifth and simd_isa.HIGH_BITS_AS_MASKS:  # per quad of columns a 64-bit mask, bit 4 lane + k
        mask = iw.wi[:, :, 256:320].reshape(g, nb, 8, 8)  # [g, b, quad, byte]
        lane, k = np.arange(16)[:, None], np.arange(4)[None, :]
        bit = (mask[:, :, :, (4 * lane + k) // 8] >> ((4 * lane + k) % 8)) & 1  # [g, b, quad, lane, k]
        codes |= bit.transpose(0, 3, 1, 2, 4).reshape(g * 16, nb, 32).astype(np.int64) << 4
    elif fifth:  # bit q of byte 256 + 4 lane + k
        field = iw.wi[:, :, 256:320].reshape(g, nb, 1, 16, 4).astype(np.int64)  # [g, b, -, lane, k]
        bit = (field >> np.arange(8)[:, None, None]) & 1  # [g, b, quad, lane, k]
        codes |= bit.transpose(0, 3, 1, 2, 4).reshape(g * 16, nb, 32) << 4
    return codes[:ROWS]


@pytest.mark.parametrize("t", [t for t in TYPES if t.i8 is not None], ids=name)
def test_int8_form_round_trips(t: WeightType) -> None:
    """repack_i8's layout holds the twin's codes, scales and mins; those give the reference values."""
    assert t.i8 is not None
    raw, want = _data(t)
    codes, d, m, offset = reference.i8_codes(raw, t.id)
    iw = repack_i8.repack(raw, t.id, ROWS, COLS)
    got_codes = _unpack_i8(iw, t.i8.fifth_bit)
    if t.i8.table is not None:  # the kernel reads the 4-bit codes through the table, as signed codes
        got_codes = np.array(t.i8.table, np.int64)[got_codes] + 128
    assert np.array_equal(got_codes, codes)
    assert np.array_equal(rows(iw.wd, 2)[..., 0], f16_bits(d))
    assert (m is not None) == t.i8.has_min == (iw.wm.size > 0)
    if m is not None:
        assert np.array_equal(rows(iw.wm, 2)[..., 0], f16_bits(m))
    q = (codes - offset).astype(np.float32)
    got = q * d[:, :, None] if m is None else q * d[:, :, None] + m[:, :, None]  # ggml's order: x*d [+ m]
    assert np.array_equal(bits(got.reshape(ROWS, COLS)), bits(want))


def _unpack_k(kw: repack_k.KWeights, t: WeightType) -> tuple[np.ndarray, np.ndarray]:
    """The K-quant record's codes int64 [ROWS, COLS] and its header bytes per row [ROWS, S, head]
    (the header's [.., 16] lane-major arrays transposed to row-major)."""
    assert t.k is not None
    g, s, _ = kw.wk.shape
    head, blk = t.k.header_bytes, t.k.block_bytes
    blocks = kw.wk[:, :, head:].reshape(g, s, 8, blk)
    if t.k.bits == 2:  # quad q in bits 2 (q % 4) of the 64 bytes at 64 (q // 4)
        byte = blocks.reshape(g, s, 8, 2, 1, 16, 4).astype(np.int64)  # [g, s, b, q // 4, -, lane, k]
        crumbs = (byte >> (2 * np.arange(4))[:, None, None]) & 3  # [g, s, b, q // 4, q % 4, lane, k]
        codes2 = crumbs.transpose(0, 5, 1, 2, 3, 4, 6).reshape(g * 16, -1)
        return codes2[:ROWS], rows(kw.wk[:, :, :head].reshape(g, s, -1, 16), 3)
    byte = blocks[..., :256].reshape(g, s, 8, 4, 16, 4)  # [g, s, b, quad, lane, k]
    byte = byte.transpose(0, 4, 1, 2, 3, 5).reshape(g * 16, s, 8, 16).astype(np.int64)
    codes = np.concatenate([byte & 15, byte >> 4], axis=-1)  # [row, s, b, 32]
    lane, k = np.arange(16)[:, None], np.arange(4)[None, :]
    if t.k.bits > 4 and not simd_isa.HIGH_BITS_AS_MASKS:  # byte fields: width 1 (5-bit) or 2 (6-bit) per quad
        width = t.k.bits - 4
        field = blocks[..., 256 : 256 + 64 * width].reshape(g, s, 8, width, 1, 16, 4).astype(np.int64)
        per = 8 // width  # quads per 64 bytes
        hi = (field >> (width * np.arange(per))[:, None, None]) & ((1 << width) - 1)  # [g, s, b, q // per, q % per, lane, k]
        codes |= hi.transpose(0, 5, 1, 2, 3, 4, 6).reshape(g * 16, s, 8, 32) << 4
        return codes.reshape(g * 16, -1)[:ROWS], rows(kw.wk[:, :, :head].reshape(g, s, -1, 16), 3)
    for e in range(4, t.k.bits):  # bit e of quad q's codes: a nibble of byte 256 + 64 (e - 4) + 8q + lane/2
        at = 256 + 64 * (e - 4)
        mask = blocks[..., at : at + 64].reshape(g, s, 8, 8, 8)  # [g, s, b, quad, byte]
        bit = (mask[..., lane // 2] >> (4 * (lane % 2) + k)) & 1  # [g, s, b, quad, lane, k]
        codes |= bit.transpose(0, 4, 1, 2, 3, 5).reshape(g * 16, s, 8, 32).astype(np.int64) << e
    return codes.reshape(g * 16, -1)[:ROWS], rows(kw.wk[:, :, :head].reshape(g, s, -1, 16), 3)


@pytest.mark.parametrize("t", [t for t in TYPES if t.k is not None and t.k.grid is None], ids=name)
def test_k_form_round_trips(t: WeightType) -> None:
    """repack_k's record holds the twin's codes and the file's scales; those give the reference values."""
    assert t.k is not None
    raw, want = _data(t)
    codes, sc, mn, d, dmin = reference.k_codes(raw, t.id)
    kw = repack_k.repack_k(raw, t.id, ROWS, COLS)
    fmt = t.k.bits if t.k.table is None else simd_dot.table_format(t.k.bits, t.k.table)
    assert kw.wk.shape[2] == t.k.record_bytes and kw.args[1:] == (t.id, fmt, t.k.header_bytes)
    got_codes, hdr = _unpack_k(kw, t)
    if t.k.table is not None:  # read through the table, as signed codes
        got_codes = np.array(t.k.table, np.int64)[got_codes] + 128
    assert np.array_equal(got_codes, codes)
    blk = raw.reshape(ROWS, -1, t.type_size)
    g, s = kw.wk.shape[:2]
    sc_at = t.offset("scales") if "scales" in t.dtype.names else -1
    if t.k.bits == 2:  # TQ1_0, TQ2_0: d [16] f16 only
        d_at = t.offset("d")
        assert np.array_equal(rows(kw.wk[:, :, :32].reshape(g, s, 16, 2), 2), blk[:, :, d_at : d_at + 2])
    elif t.k.table is not None:  # IQ4_XS: d [16] f16, then the 8 scales - 32 as int8 [8][16]
        assert np.array_equal(rows(kw.wk[:, :, :32].reshape(g, s, 16, 2), 2), blk[:, :, 0:2])
        assert np.array_equal(hdr[:, :, 2:].view(np.int8).astype(np.int64), sc)
    elif t.k.has_min:  # d, dmin as [16] f16 each (two bytes per lane), then sc [8][16] and m [8][16] as bytes
        assert np.array_equal(rows(kw.wk[:, :, :64].reshape(g, s, 2, 16, 2), 3), blk[:, :, :4])
        assert mn is not None and np.array_equal(hdr[:, :, 4:12], sc) and np.array_equal(hdr[:, :, 12:20], mn)
    else:  # d [16] f16, then the 16 int8 scales [16][16]
        d_at = t.offset("d")
        assert np.array_equal(rows(kw.wk[:, :, :32].reshape(g, s, 16, 2), 2), blk[:, :, d_at : d_at + 2])
        assert np.array_equal(hdr[:, :, 2:], blk[:, :, sc_at : sc_at + 16])
    width = 32 if t.k.has_min or t.k.table is not None or t.k.bits == 2 else 16  # columns per sub-block scale
    dl = (d[:, :, None] * sc.astype(np.float32)).reshape(ROWS, -1)  # d * sc, rounded once as ggml does
    q = codes.astype(np.float32).reshape(ROWS, -1, width)
    if t.k.bits == 2:
        got = (q - np.float32(1)) * dl[:, :, None]  # ggml's (t - 1) * d
    elif t.k.table is not None:
        got = dl[:, :, None] * (q - np.float32(128))
    elif mn is None:
        got = dl[:, :, None] * (q - np.float32(32))
    else:
        assert dmin is not None
        ml = (dmin[:, :, None] * mn.astype(np.float32)).reshape(ROWS, -1)
        got = dl[:, :, None] * q - ml[:, :, None]
    assert np.array_equal(bits(got.reshape(ROWS, COLS)), bits(want))


@pytest.mark.parametrize("t", [t for t in TYPES if t.k is not None and t.k.grid is not None], ids=name)
def test_grid_form_round_trips(t: WeightType) -> None:
    """repack_grid's record (GridCodes' layout, unpacked here from its bytes) holds the twin's
    signed grid values, the file's d and 4-bit scales; d * factor * (2s + 1) * value is the
    reference dequantizer's float32, bit for bit."""
    from edge_infer.formats.quants_iq import grid as grid_values

    assert t.k is not None and t.k.grid is not None
    gc = t.k.grid
    raw, want = _data(t)
    codes, sc, _, d, _ = reference.k_codes(raw, t.id)
    kw = repack_k.repack_k(raw, t.id, ROWS, COLS)
    assert kw.wk.shape[2] == t.k.record_bytes
    assert kw.args[1:] == (t.id, simd_dot.table_format(8, None, gc), t.k.header_bytes)
    g, s, _ = kw.wk.shape
    n, high = 32 // gc.width, gc.index_bits - 8
    blocks = kw.wk[:, :, t.k.header_bytes :].reshape(g, s, 8, t.k.block_bytes).astype(np.int64)
    idx = blocks[..., : 16 * n].reshape(g, s, 8, n, 16)  # [g, s, b, vector, lane]
    for k in range(high):  # bit 8 + k of vector v's rows: a u16 mask at 16n + 2 (k n + v)
        m = blocks[..., 16 * n + 2 * k * n : 16 * n + 2 * (k + 1) * n].reshape(g, s, 8, n, 2)
        m = m[..., 0] | (m[..., 1] << 8)
        idx |= ((m[..., None] >> np.arange(16)) & 1) << (8 + k)
    vals = grid_values(gc.name).astype(np.int64)[idx]  # [g, s, b, vector, lane, width]
    vals = vals.transpose(0, 4, 1, 2, 3, 5).reshape(g * 16, s, 8, 32)
    if gc.signed:  # IQ1's entries carry their signs
        at = 16 * n + 2 * high * n
        sign = blocks[..., at : at + 64].reshape(g, s, 8, 8, 8)  # [g, s, b, quad, byte]: bit 4 lane + k
        lane, kk = np.arange(16)[:, None], np.arange(4)[None, :]
        neg = (sign[..., (4 * lane + kk) // 8] >> ((4 * lane + kk) % 8)) & 1  # [g, s, b, quad, lane, k]
        vals = np.where(neg.transpose(0, 4, 1, 2, 3, 5).reshape(g * 16, s, 8, 32) == 1, -vals, vals)
    assert np.array_equal(vals.reshape(g * 16, -1)[:ROWS], codes - 128)
    d_bits = rows(kw.wk[:, :, :32].reshape(g, s, 16, 2), 2).copy().view(np.float16)[..., 0]
    assert np.array_equal(d_bits.astype(np.float32) * np.float32(gc.d_factor), d)  # the file's d (IQ1_M's assembled)
    hdr = rows(kw.wk[:, :, 32 : t.k.header_bytes].reshape(g, s, -1, 16), 3)  # [row, s, bytes]: two s each
    nib = np.stack([hdr & 15, hdr >> 4], axis=-1).reshape(ROWS, s, -1).astype(np.int64)
    assert np.array_equal(2 * nib + 1, sc)
    dl = np.repeat(d[:, :, None] * sc.astype(np.float32), gc.scale_cols, axis=-1)
    got = dl.reshape(ROWS, COLS) * (codes - 128).astype(np.float32)
    assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("t", QUANTIZED, ids=name)
def test_cuda_form_round_trips(t: WeightType) -> None:
    """kernels_cuda.layout's host form is the record's and decodes to the reference values (a
    zero offset added: -0.0 may come back +0.0)."""
    raw, want = _data(t)
    hm = layout.to_host_matrix(raw, t.id, ROWS, COLS)
    assert hm.kind == t.cuda.kind and hm.off == t.cuda.nibble_offset
    assert np.array_equal(layout.decode(hm), want)
    if t.cuda.kind == "nibbles":
        plain = layout.to_host_matrix(raw, t.id, ROWS, COLS, nibbles=False)
        assert plain.kind == "codes" and np.array_equal(layout.decode(plain), want)
