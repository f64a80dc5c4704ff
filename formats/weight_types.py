"""One record per GGML weight type edge-infer handles: its sizes, its block's byte layout, and
each form the backends compute it in. Every other table of per-type facts (quants.BLOCK_LAYOUTS,
kernels_cpu's ids, int8 and K-quant formats, the backends' kernel choices, kernels_cuda's form,
the quantizer's fallbacks) is derived from these records; tests/formats/test_weight_types.py
checks the records against gguf-py and each derived table and codec against them.

Ids are plain ints (ggml.h's `enum ggml_type`), exported as module constants (`Q4_0 = 2`): numba
kernels dispatch on them and read module-level ints as compile-time constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_infer.errors import UnsupportedTensorType

__all__ = [
    "BF16", "F16", "F32", "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_NL",
    "IQ4_XS", "MXFP4", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0",
    "Q8_K", "QK", "QK_K", "IQ4_TABLE", "MXFP4_TABLE", "TQ1_0", "TQ2_0", "TYPES", "CudaForm", "GridCodes", "I8Form",
    "KForm", "WeightType",
    "by_name", "weight_type",
]

# the 16 non-linear 4-bit values of IQ4_NL / IQ4_XS (ggml's kvalues_iq4nl)
IQ4_TABLE = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# E2M1 (MXFP4's element format) doubled: the block scale carries the 0.5 (ggml's kvalues_mxfp4)
MXFP4_TABLE = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)

QK = 32  # elements per block of the "legacy" types
QK_K = 256  # elements per super-block of the K-quants

# GGML type ids (gguf.GGMLQuantizationType values)
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, BF16 = 10, 11, 12, 13, 14, 15, 30
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
IQ1_M, TQ1_0, TQ2_0, MXFP4 = 29, 34, 35, 39


@dataclass(frozen=True, slots=True)
class I8Form:
    """The int8 kernel's form (kernels_cpu.repack_i8, matmul_i8): per 16-row group and 32-column
    block, `block_bytes` of codes (8-, 4- or 5-bit format). zero: the u8 code of a zero weight,
    or None for signed codes (Q8_0: stored as q + 128; which offset the dot products then use
    depends on the CPU, kernels_cpu.repack_i8 decides). has_min: a float min per block (x = d*q
    + m); fifth_bit: a fifth code bit per column (qh). roles: the matrices the backend takes it
    for ("layer", "output"). table: the 16 int8 weights a 4-bit code stands for (IQ4_NL, MXFP4),
    or None: the kernel reads the 4-bit codes through it into signed 8-bit codes (zero None)."""

    block_bytes: int
    zero: int | None
    has_min: bool
    fifth_bit: bool
    roles: tuple[str, ...] = ("layer",)
    table: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class GridCodes:
    """A codebook type's codes in the K-quant kernel: per `width` columns (8, or 4 for IQ3) an
    index of `index_bits` into grid `name` (formats.quants_iq.grid), per column a sign bit; per
    `scale_cols` columns (16 or 32) a 4-bit s, weight = (d * d_factor) * (2s + 1) * +-grid.
    A 32-column block of 16 rows: the index's low bytes, [32 / width][16]; its high bits as
    16-bit row masks, [index_bits - 8][32 / width]; per quad a 64-bit mask of the signs.
    signed False (IQ1_S, IQ1_M): no sign masks; the grid's entries are already signed (IQ1's
    8 * grid +- 1, the delta's sign the index's top bit)."""

    name: str
    width: int
    index_bits: int
    scale_cols: int
    d_factor: float
    signed: bool = True

    @property
    def block_bytes(self) -> int:
        n = 32 // self.width
        return 16 * n + 2 * (self.index_bits - 8) * n + (64 if self.signed else 0)


@dataclass(frozen=True, slots=True)
class KForm:
    """The K-quant int8 kernel's form (kernels_cpu.repack_k, matmul_k), for every role: per
    16-row group and 256-column super-block one record of `record_bytes` (16 rows of the file's
    bytes): `header_bytes` of scales (d, [dmin], packed sub-block scales [and mins]), then 8
    blocks of 32 columns in the `bits`-bit code format (64 * bits bytes each). has_min: codes
    are unsigned with a min per sub-block (x = d*sc*q - dmin*m), else x = d*sc*(q - 32); table:
    as I8Form's (IQ4_XS: x = d*sc*table[q], int8 scales sc per 32 in the header); bits 2: the
    ternary types, x = d*(q - 1), no sub-block scales; grid: the codebook types' codes
    (GridCodes; bits 8: the dot products' bytes), d f16 [16] and their s two per byte in the
    header."""

    record_bytes: int
    bits: int
    header_bytes: int
    has_min: bool
    table: tuple[int, ...] | None = None
    grid: GridCodes | None = None

    @property
    def block_bytes(self) -> int:
        """Bytes of one 32-column block of 16 rows in the code format."""
        return self.grid.block_bytes if self.grid is not None else 64 * self.bits


@dataclass(frozen=True, slots=True)
class CudaForm:
    """kernels_cuda.layout's form: "codes" (int8 codes, a scale and an offset per 16 columns),
    "nibbles" (the codes plus nibble_offset, 0..15, two per byte; "codes" when asked not to
    pack) or "float" (decoded rows)."""

    kind: str
    nibble_offset: int = 0


_FLOAT, _CODES = CudaForm("float"), CudaForm("codes")


@dataclass(frozen=True, slots=True)
class WeightType:
    """One GGML type: `block_size` elements stored in `type_size` bytes; `dtype` a NumPy
    structured dtype of one block (itemsize == type_size) with its fields named. family:
    "float" | "legacy" (32-element blocks) | "k" (256-element super-blocks). i8 / k: its form
    in the CPU backend's int8 / K-quant kernel, or None (the float path); cuda: its CUDA form.
    fallback: the type requantizing falls back to when a row length is not a multiple of
    block_size (quant_policy). quantizer / weighted: whether formats.quantizers /
    formats.quantizers_weighted have an encoder for it; needs_importance: the encoder needs an
    importance matrix (IQ2_XXS, IQ2_XS, IQ1_S, as in llama.cpp)."""

    id: int
    name: str
    block_size: int
    type_size: int
    dtype: np.dtype
    family: str
    i8: I8Form | None = None
    k: KForm | None = None
    cuda: CudaForm = _FLOAT
    fallback: int | None = None
    quantizer: bool = True
    weighted: bool = False
    needs_importance: bool = False

    def offset(self, field: str) -> int:
        """Byte offset of the named field ("d", "qs", ...) in a block."""
        fields = self.dtype.fields
        if fields is None or field not in fields:
            raise KeyError(f"{self.name} blocks have no field {field!r}")
        return int(fields[field][1])


def _blk(*fields: tuple) -> np.dtype:
    return np.dtype(list(fields))


# Byte layouts, in storage order; f16/f32 little-endian. "lo"/"hi" = low/high nibble.
TYPES: tuple[WeightType, ...] = (
    WeightType(F32, "F32", 1, 4, np.dtype("<f4"), "float"),
    WeightType(F16, "F16", 1, 2, np.dtype("<f2"), "float"),
    # the top 16 bits of an f32
    WeightType(BF16, "BF16", 1, 2, np.dtype("<u2"), "float"),
    # d: f16 | qs: 16 x u8 (lo = element j, hi = element j+16); x = d * (q - 8)
    WeightType(Q4_0, "Q4_0", QK, 18,
               _blk(("d", "<f2"), ("qs", "u1", 16)), "legacy",
               i8=I8Form(256, zero=8, has_min=False, fifth_bit=False),
               cuda=CudaForm("nibbles", 8), weighted=True),
    # d: f16 | m: f16 | qs: 16 x u8 (as Q4_0); x = d*q + m
    WeightType(Q4_1, "Q4_1", QK, 20,
               _blk(("d", "<f2"), ("m", "<f2"), ("qs", "u1", 16)), "legacy",
               i8=I8Form(256, zero=0, has_min=True, fifth_bit=False),
               cuda=CudaForm("nibbles", 0), weighted=True),
    # d: f16 | qh: u32 (bit j = bit 4 of element j) | qs: 16 x u8 (as Q4_0); x = d * (q - 16)
    WeightType(Q5_0, "Q5_0", QK, 22,
               _blk(("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)), "legacy",
               i8=I8Form(320, zero=16, has_min=False, fifth_bit=True),
               cuda=_CODES, weighted=True),
    # d: f16 | m: f16 | qh: u32 | qs: 16 x u8 (as Q5_0); x = d*q + m
    WeightType(Q5_1, "Q5_1", QK, 24,
               _blk(("d", "<f2"), ("m", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)), "legacy",
               i8=I8Form(320, zero=0, has_min=True, fifth_bit=True),
               cuda=_CODES, weighted=True),
    # d: f16 | qs: 32 x i8; x = q * d
    # (the int8 kernel for outputs too: Q8_0 layers on it moved qwen2.5-0.5b's mean KL from
    # llama.cpp 0.0051 -> 0.0029; llama.cpp quantizes activations there too)
    WeightType(Q8_0, "Q8_0", QK, 34,
               _blk(("d", "<f2"), ("qs", "i1", 32)), "legacy",
               i8=I8Form(512, zero=None, has_min=False, fifth_bit=False, roles=("layer", "output")),
               cuda=_CODES),
    # scales: 16 x u8 (lo = scale, hi = min of sub-block s, 16 elements each) |
    # qs: 64 x u8 (element 128h + 32j + l = bits 2j..2j+1 of qs[32h + l]) | d: f16 | dmin: f16
    # x = (d*sc)*q - dmin*m
    WeightType(Q2_K, "Q2_K", QK_K, 84,
               _blk(("scales", "u1", 16), ("qs", "u1", 64), ("d", "<f2"), ("dmin", "<f2")), "k",
               fallback=Q5_0, weighted=True),
    # hmask: 32 x u8 (element 128h + 32j + l: bit 4h+j of hmask[l]) | qs: 64 x u8 (2 low bits, as
    # Q2_K) | scales: 12 x u8 (16 6-bit scales: low 4 bits in bytes 0-7 lo then hi, high 2 bits in
    # bytes 8-11) | d: f16; x = (d * (sc - 32)) * (q - (hmask bit ? 0 : 4))
    WeightType(Q3_K, "Q3_K", QK_K, 110,
               _blk(("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12), ("d", "<f2")), "k",
               fallback=Q5_0, weighted=True),
    # d: f16 | dmin: f16 | scales: 12 x u8 (8 6-bit scales + 8 6-bit mins, see kscales.k4_scale_min)
    # | qs: 128 x u8 (element 64p + l = lo of qs[32p + l], 64p + 32 + l = hi); x = (d*sc)*q - dmin*m
    WeightType(Q4_K, "Q4_K", QK_K, 144,
               _blk(("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)), "k",
               k=KForm(2368, bits=4, header_bytes=320, has_min=True),
               cuda=CudaForm("nibbles", 0), fallback=Q5_0, weighted=True),
    # d: f16 | dmin: f16 | scales: 12 x u8 (as Q4_K) | qh: 32 x u8 (element 32s + l: bit s of
    # qh[l]) | qs: 128 x u8 (4 low bits, as Q4_K); x = (d*sc)*q - dmin*m
    WeightType(Q5_K, "Q5_K", QK_K, 176,
               _blk(("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)),
               "k",
               k=KForm(2880, bits=5, header_bytes=320, has_min=True),
               cuda=_CODES, fallback=Q5_1, weighted=True),
    # ql: 128 x u8 (element 128h + 32k + l: lo (k<2) or hi (k>=2) of ql[64h + 32(k%2) + l]) |
    # qh: 64 x u8 (bits 2k..2k+1 of qh[32h + l]) | scales: 16 x i8 (one per 16 elements) | d: f16
    # x = (d*sc) * (q - 32)
    WeightType(Q6_K, "Q6_K", QK_K, 210,
               _blk(("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")), "k",
               k=KForm(3360, bits=6, header_bytes=288, has_min=False),
               cuda=_CODES, fallback=Q8_0, weighted=True),
    # d: f32 | qs: 256 x i8 | bsums: 16 x i16 (sum of each 16 quants, for dot products); x = d * q
    WeightType(Q8_K, "Q8_K", QK_K, 292,
               _blk(("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)), "k"),
    # The non-linear and codebook types (formats/quants_iq.py decodes them; the float path
    # computes them). d: f16 | qs: 16 x u8 (as Q4_0); x = d * IQ4_VALUES[q]
    # (int8 kernel: the nibbles as Q4_0's, read through the table: 4-bit bytes, 8-bit arithmetic)
    WeightType(IQ4_NL, "IQ4_NL", QK, 18, _blk(("d", "<f2"), ("qs", "u1", 16)), "legacy",
               i8=I8Form(256, zero=None, has_min=False, fifth_bit=False, roles=("layer", "output"),
                         table=IQ4_TABLE),
               cuda=_CODES, weighted=True),
    # d: f16 | scales_h: u16 (2 high bits of 8 6-bit scales) | scales_l: 4 x u8 (their low
    # nibbles) | qs: 128 x u8 (per 32: as IQ4_NL); x = (d * (sc - 32)) * IQ4_VALUES[q]
    # (K-quant kernel: d f16 [16] | sc - 32 as int8, byte-major [8][16] | 8 blocks of nibbles
    # read through the table; 2208 bytes per record, the file's 2176 + 1.5%)
    WeightType(IQ4_XS, "IQ4_XS", QK_K, 136,
               _blk(("d", "<f2"), ("scales_h", "<u2"), ("scales_l", "u1", 4), ("qs", "u1", 128)), "k",
               k=KForm(2208, bits=4, header_bytes=160, has_min=False, table=IQ4_TABLE),
               cuda=_CODES, fallback=IQ4_NL, weighted=True),
    # d: f16 | qs: 32 x u16 (per 32 values: 4 grid-row bytes, then a u32 of 4 x 7 sign bits and
    # a 4-bit scale); x = ((d * (0.5 + s)) * 0.25) * +-grid
    # (K-quant kernel, as all the IQ2 / IQ3 types: GridCodes; 1120 bytes per record, the file's
    # 1056 + 6%: a sign bit per column)
    WeightType(IQ2_XXS, "IQ2_XXS", QK_K, 66, _blk(("d", "<f2"), ("qs", "<u2", 32)), "k",
               k=KForm(1120, bits=8, header_bytes=96, has_min=False, grid=GridCodes("IQ2_XXS", 8, 8, 32, 0.125)),
               fallback=IQ4_NL, needs_importance=True),
    # d: f16 | qs: 32 x u16 (9-bit grid row, 7 sign bits) | scales: 8 x u8 (two 4-bit scales)
    # (1248 bytes per record, the file's 1184 + 5.4%)
    WeightType(IQ2_XS, "IQ2_XS", QK_K, 74, _blk(("d", "<f2"), ("qs", "<u2", 32), ("scales", "u1", 8)), "k",
               k=KForm(1248, bits=8, header_bytes=160, has_min=False, grid=GridCodes("IQ2_XS", 8, 9, 16, 0.125)),
               fallback=IQ4_NL, needs_importance=True),
    # d: f16 | qs: 32 grid-row bytes + 32 sign bytes | qh: 8 x u8 (2 high row bits) | scales: 8
    WeightType(IQ2_S, "IQ2_S", QK_K, 82,
               _blk(("d", "<f2"), ("qs", "u1", 64), ("qh", "u1", 8), ("scales", "u1", 8)), "k",
               k=KForm(1312, bits=8, header_bytes=160, has_min=False, grid=GridCodes("IQ2_S", 8, 10, 16, 0.125)),
               fallback=IQ4_NL),
    # d: f16 | qs: 64 bytes of 4-wide grid rows, then 8 x u32 (4 x 7 sign bits, a 4-bit scale)
    # (1632 bytes per record, the file's 1568 + 4%)
    WeightType(IQ3_XXS, "IQ3_XXS", QK_K, 98, _blk(("d", "<f2"), ("qs", "u1", 96)), "k",
               k=KForm(1632, bits=8, header_bytes=96, has_min=False, grid=GridCodes("IQ3_XXS", 4, 8, 32, 0.25)),
               fallback=IQ4_NL),
    # d: f16 | qs: 64 | qh: 8 (bit 8 of each row) | signs: 32 | scales: 4 (x = d * (1 + 2s) * +-grid)
    WeightType(IQ3_S, "IQ3_S", QK_K, 110,
               _blk(("d", "<f2"), ("qs", "u1", 64), ("qh", "u1", 8), ("signs", "u1", 32), ("scales", "u1", 4)),
               "k", k=KForm(1760, bits=8, header_bytes=96, has_min=False, grid=GridCodes("IQ3_S", 4, 9, 32, 1.0)),
               fallback=IQ4_NL),
    # d: f16 | qs: 32 | qh: 8 x u16 (4 x 3 high row bits, a 3-bit scale, the delta's sign);
    # x = (d * (2s + 1)) * (grid + +-0.125), grid values -1, 0, 1
    # (K-quant kernel: GridCodes of 12-bit indices into IQ1_DELTA, 8 * grid +- 1 (the delta's
    # sign the top bit), d / 8; 864 bytes per record, the file's 800 + 8%: 4 index bits per 8)
    WeightType(IQ1_S, "IQ1_S", QK_K, 50, _blk(("d", "<f2"), ("qs", "u1", 32), ("qh", "<u2", 8)), "k",
               k=KForm(864, bits=8, header_bytes=96, has_min=False,
                       grid=GridCodes("IQ1_DELTA", 8, 12, 32, 0.125, signed=False)),
               fallback=IQ4_NL, needs_importance=True),
    # qs: 32 | qh: 16 | scales: 8 (3-bit scales; the f16 d in the top nibbles of the 4 u16)
    # (K-quant kernel: as IQ1_S with a scale per 16 and the delta's sign per 8; the f16 d
    # assembled at repack: 928 bytes per record, the file's 896 + 3.6%)
    WeightType(IQ1_M, "IQ1_M", QK_K, 56, _blk(("qs", "u1", 32), ("qh", "u1", 16), ("scales", "u1", 8)), "k",
               k=KForm(928, bits=8, header_bytes=160, has_min=False,
                       grid=GridCodes("IQ1_DELTA", 8, 12, 16, 0.125, signed=False)),
               fallback=IQ4_NL),
    # qs: 48 x u8 (5 base-3 digits each) | qh: 4 x u8 (4 digits each) | d: f16; x = (t - 1) * d
    # (K-quant kernel: d f16 [16] | 8 blocks of 2-bit codes t; the file's 1.69 bits per weight
    # unpacked to 2: 1056 bytes per record, the file's 864 + 22%)
    WeightType(TQ1_0, "TQ1_0", QK_K, 54, _blk(("qs", "u1", 48), ("qh", "u1", 4), ("d", "<f2")), "k",
               k=KForm(1056, bits=2, header_bytes=32, has_min=False), quantizer=False),
    # qs: 64 x u8 (4 two-bit digits each) | d: f16; x = (q - 1) * d
    # (K-quant kernel: d f16 [16] | 8 blocks of the 2-bit codes q: the file's bytes)
    WeightType(TQ2_0, "TQ2_0", QK_K, 66, _blk(("qs", "u1", 64), ("d", "<f2")), "k",
               k=KForm(1056, bits=2, header_bytes=32, has_min=False), quantizer=False),
    # e: E8M0 scale | qs: 16 x u8 (E2M1 codes, as Q4_0); x = MXFP4_VALUES[q] * 2^(e - 128)
    # (int8 kernel: as IQ4_NL, the scale as f16 where one holds it: kernels_cpu.repack_i8)
    WeightType(MXFP4, "MXFP4", QK, 17, _blk(("e", "u1"), ("qs", "u1", 16)), "legacy",
               i8=I8Form(256, zero=None, has_min=False, fifth_bit=False, roles=("layer", "output"),
                         table=MXFP4_TABLE),
               quantizer=False),
)
_BY_ID = {t.id: t for t in TYPES}
_BY_NAME = {t.name: t for t in TYPES}


def _type_name(qtype: int) -> str:
    from gguf import GGMLQuantizationType as T

    return T(qtype).name if qtype in T._value2member_map_ else f"{qtype} (unknown)"


def _unsupported(what: str, name: str) -> UnsupportedTensorType:
    return UnsupportedTensorType(
        f"{what}: type {name} is not supported (supported: {', '.join(t.name for t in TYPES)})"
    )


def weight_type(qtype: int, what: str = "weight type") -> WeightType:
    """The record of GGML type id `qtype` (an int or a gguf GGMLQuantizationType); an unknown
    or unhandled id raises UnsupportedTensorType naming it, prefixed by `what`."""
    t = _BY_ID.get(int(qtype))
    if t is None:
        raise _unsupported(what, _type_name(int(qtype)))
    return t


def by_name(name: str, what: str = "weight type") -> WeightType:
    """The record named `name` ("Q4_K", as gguf-py spells it; case-insensitive)."""
    t = _BY_NAME.get(name.upper())
    if t is None:
        raise _unsupported(what, repr(name))
    return t
