"""The generated code of the hot loops: full-width vectors (zmm on AVX-512 hosts, ymm on AVX2
ones), vectorized int -> float conversion in the decoders, FMAs in the matmul loop, no gathers
(numba wraps an index it cannot prove non-negative, and LLVM then gathers), and one instruction
per fp16 conversion on F16C hosts.

numba's inspect_asm has nothing for code loaded from the on-disk cache, so each function is
compiled afresh here from its Python source, with the flags of its kernel decorator.
Skipped where the target is not the host (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES set) or the host
has neither AVX-512 nor AVX2.
"""

from __future__ import annotations

import os
import re

import numba
import pytest
from asm_helpers import asm_of
from llvmlite import binding as llvm
from numba import types as nt
from numba.core import config

from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import matmul as mm
from edge_infer.kernels_cpu._jit import f16_to_f32, f32_to_f16

HOST = set(llvm.get_host_cpu_features().flatten().split(","))
OVERRIDDEN = any(
    k in os.environ for k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "EDGE_INFER_NUMBA_DEFAULTS")
)
VREG = "zmm" if "+avx512f" in HOST else "ymm" if "+avx2" in HOST else None

pytestmark = pytest.mark.skipif(
    OVERRIDDEN or VREG is None, reason="code generation target is not an AVX2/AVX-512 host"
)

U8 = nt.Array(nt.uint8, 2, "C")
F32 = nt.Array(nt.float32, 2, "C")
DECODER_SIG = (U8, nt.int64, F32, nt.int64)
ROW_GROUPS_SIG = (F32, U8, nt.int64, F32, nt.int64, nt.int64, F32)


def uses(asm: str, mnemonic: str, reg: str) -> bool:
    """Some instruction starting with `mnemonic` has a `reg` operand (e.g. vfmadd, zmm)."""
    return re.search(rf"^\s*{mnemonic}\w*\s[^\n]*\b%?{reg}\d+", asm, re.MULTILINE) is not None


def test_avx512_codegen_is_on() -> None:
    """_jit lifts LLVM's 256-bit preference on AVX-512 hosts (zmm below depends on it)."""
    if VREG == "zmm":
        assert "-prefer-256-bit" in (config.CPU_FEATURES or "")


def test_full_width_codegen_whatever_is_imported_first() -> None:
    """numba builds its CPU target once, at the first numba function defined anywhere: the engine
    imports formats' compiled quantizer fits (formats/quant_fit.py) long before the kernels, so
    those must apply the settings too, or every kernel of the process compiles with 256-bit
    vectors (the public API's forward ran ymm kernels while `edge-infer bench` ran zmm ones)."""
    import subprocess
    import sys

    probe = ("import edge_infer.formats.quants\n"
             "from numba.core.registry import cpu_target\n"
             "print(cpu_target.target_context.codegen()._tm_features)")
    feats = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    if VREG == "zmm":
        assert "-prefer-256-bit" in feats, feats


@pytest.mark.parametrize("name", ["decode_q4_1", "decode_q8_0", "decode_q4_k", "decode_q6_k"])
def test_decoders_vectorize(name: str) -> None:
    asm = asm_of(getattr(dq, name), DECODER_SIG)
    assert uses(asm, "vcvtdq2ps", VREG), f"{name}: no {VREG} int->float conversion"
    assert "gather" not in asm, f"{name}: gathers (an index numba cannot prove non-negative?)"


def functions(asm: str) -> dict[str, str]:
    """An assembly listing split into its functions: mangled name -> body."""
    parts = re.split(r"^\s*\.type\s+([^,\s]+),@function\s*$", asm, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_matmul_loop_uses_full_width_fma() -> None:
    asm = asm_of(mm._row_groups, ROW_GROUPS_SIG)
    assert uses(asm, "vfmadd", VREG), f"_row_groups: no {VREG} FMA"
    assert uses(asm, "vcvtdq2ps", VREG)  # the decoders linked into it
    # The codebook types' decoders (dequant_iq, inlined into dequant.decode_iq_rows) look their
    # values up in tables, which LLVM vectorizes as gathers by design; nothing else may gather.
    bodies = functions(asm)
    codebook = [name for name in bodies if "decode_iq_rows" in name or "dequant_iq" in name]
    assert codebook, list(bodies)
    gathering = [name for name, body in bodies.items() if "gather" in body and name not in codebook]
    assert not gathering, gathering


@numba.njit(nogil=True)
def _to_f32(bits):  # type: ignore[no-untyped-def]
    return f16_to_f32(bits)


@numba.njit(nogil=True)
def _to_f16(x):  # type: ignore[no-untyped-def]
    return f32_to_f16(x)


# The signatures of matmul_i8._i8_groups and matmul_k._k_groups, whose asm the int8 tests read.
_I32_1, _I32_2 = nt.Array(nt.int32, 1, "C"), nt.Array(nt.int32, 2, "C")
_F32_1, _F32_2, _U16_3 = nt.Array(nt.float32, 1, "C"), nt.Array(nt.float32, 2, "C"), nt.Array(nt.uint16, 3, "C")
I8_GROUPS_SIG = (_I32_2, _F32_2, _I32_2, nt.Array(nt.uint8, 3, "C"), _U16_3, _U16_3, nt.int64, nt.int64, _F32_2,
                 nt.int64, nt.int64, _I32_1, _F32_2)
_I64 = nt.int64
K_GROUPS_SIG = (_I32_1, _F32_1, _I32_1, _I64, _I64, _I64, nt.Array(nt.uint8, 1, "C"), nt.Array(nt.uint16, 1, "C"), _I64,
                _I64, _I64, _I64, _I64, _F32_2, _I64, _I64, _I32_1, _I32_1, _F32_1, _F32_1, _F32_1, _F32_1, _F32_1,
                _F32_1, nt.Array(nt.uint8, 1, "C"))


@pytest.mark.skipif("+f16c" not in HOST, reason="no F16C")
def test_f16_conversions_are_single_instructions() -> None:
    _to_f32.compile((nt.uint16,))
    _to_f16.compile((nt.float32,))
    up, down = _to_f32.inspect_asm((nt.uint16,)), _to_f16.inspect_asm((nt.float32,))
    assert re.search(r"vcvt(ph2ps|sh2ss)", up), up
    assert re.search(r"vcvt(ps2ph|ss2sh)", down), down
    assert "__extendhfsf2" not in up and "__truncsfhf2" not in down  # no library calls
    assert uses(asm_of(dq.decode_f16, DECODER_SIG), "vcvtph2ps", VREG)


@pytest.mark.skipif("+avx512vnni" not in HOST, reason="no AVX-512 VNNI")
def test_int8_matmul_uses_vpdpbusd() -> None:
    """Every weight format (8-, 4-, 5-bit, the two table formats) reaches the kernel's dot
    products as zmm vpdpbusd, the tables as zmm vpshufb (one per 64 code bytes, never a gather),
    and the per-block float epilogue is vector code that converts the f16 scales 16 at once."""
    from edge_infer.kernels_cpu import matmul_i8 as m8

    asm = asm_of(m8._i8_groups, I8_GROUPS_SIG)
    assert len(re.findall(r"vpdpbusd\s[^\n]*zmm", asm)) >= 6 * 8, "fewer vpdpbusd than one block of each path"
    assert len(re.findall(r"vpshufb\s[^\n]*zmm", asm)) >= 2 * 8, "fewer vpshufb than one block of each table"
    assert uses(asm, "vcvtdq2ps", "zmm") and uses(asm, "vcvtph2ps", "zmm")
    assert "gather" not in asm


@pytest.mark.skipif("+avx512vnni" not in HOST, reason="no AVX-512 VNNI")
def test_k_quant_matmul_uses_vpdpbusd() -> None:
    """The K-quant kernel's formats (4-, 5-, 6-bit, IQ4_XS's table, the 7 grids) reach zmm
    vpdpbusd, one and four tokens each (8 * 8 quads at least), the table as zmm vpshufb; the
    grids' words are zmm gathers (8 per block, staged as 8-bit codes) and the IQ2 / IQ3 signs
    masked vpsubb; scales are unpacked and applied as zmm vector code (conversions to float);
    no other gathers; no reference counting."""
    from edge_infer.kernels_cpu import matmul_k as mk

    asm = asm_of(mk._k_groups, K_GROUPS_SIG)
    assert len(re.findall(r"vpdpbusd\s[^\n]*zmm", asm)) >= 10 * 8, "fewer vpdpbusd than one block of each path"
    assert len(re.findall(r"vpshufb\s[^\n]*zmm", asm)) >= 4, "fewer vpshufb than one block of the table"
    # per staged block: IQ3's 8 dword gathers of 16 rows, IQ2's and IQ1's 4 x 2 qword gathers of 8 rows
    # (whole entries; IQ1_S and IQ1_M share one staging);
    # numba 0.68.1's LLVM merges one of the two IQ3 grids' identical gathers into the other (15)
    dword = len(re.findall(r"vpgatherdd\s[^\n]*zmm", asm))
    assert 2 * 8 - 1 <= dword <= 2 * 8, "an IQ3 block is not 8 zmm dword gathers"
    assert len(re.findall(r"vpgatherdq\s[^\n]*zmm", asm)) == 4 * 8, "an IQ2 / IQ1 block is not 8 zmm qword gathers"
    # (LLVM writes a few of the 40 masked negations as a subtraction and a masked blend)
    assert len(re.findall(r"vpsubb\s[^\n]*zmm[^\n]*\{%k", asm)) >= 4 * 8, "signs not applied under a mask"
    assert len(re.findall(r"gather", asm)) == dword + 4 * 8  # no other gathers
    assert uses(asm, "vcvtdq2ps", "zmm") and uses(asm, "vcvtph2ps", "zmm")
    # compiled without reference counting: the increments around each call in a branch cost
    # ~65-100 ns a super-block (kernel(refcount=False))
    assert "NRT_incref" not in asm and "NRT_decref" not in asm


def _loops(asm: str) -> list[str]:
    """The asm's basic blocks (from one label to the next)."""
    return re.split(r"^\.?\w+:", asm, flags=re.MULTILINE)


@pytest.mark.skipif("+avx512vnni" not in HOST, reason="no AVX-512 VNNI")
def test_gemm_pair_tiles_share_each_broadcast() -> None:
    """A GEMM's four-token tile over two row groups (simd_tile.k_pair_tile, i8_pair_tile) is a
    loop of 64 vpdpbusd per 32-column block whose token quads are broadcast once for both
    groups: at most one broadcast per two dot products (with one group, each vpdpbusd took a
    broadcast load of its own and the loads bound the tile)."""
    from edge_infer.kernels_cpu import matmul_i8 as m8
    from edge_infer.kernels_cpu import matmul_k as mk

    for fn, sig in ((m8._i8_groups, I8_GROUPS_SIG), (mk._k_groups, K_GROUPS_SIG)):
        pairs = [b for b in _loops(asm_of(fn, sig)) if len(re.findall(r"vpdpbusd\s[^\n]*zmm", b)) >= 64]
        assert pairs, f"{fn.__name__}: no loop of two groups' dot products"
        for body in pairs:
            broadcasts = len(re.findall(r"vpbroadcastd\s[^\n]*\(", body)) + len(re.findall(r"\{1to16\}", body))
            assert broadcasts <= 32 + 8, (fn.__name__, broadcasts)


@pytest.mark.skipif("+avx512vnni" in HOST or "+avx2" not in HOST or OVERRIDDEN, reason="not an AVX2 host without VNNI")
def test_int8_matmuls_use_vpmaddubsw_on_avx2() -> None:
    """Without VNNI, the dot products of both int8 kernels (legacy and K-quant formats) are
    vpmaddubsw + vpmaddwd on ymm registers (simd_isa.maddubs16_ir, widen16_ir), not widened
    multiplies (the K-quant codes' pair sums widened once per several quads), and
    the table formats' lookups ymm vpshufb. The only gathers are the grid types' codebook words
    as their blocks are staged (dword gathers on AVX2: 96 with numba 0.68.1's LLVM)."""
    from edge_infer.kernels_cpu import matmul_i8 as m8
    from edge_infer.kernels_cpu import matmul_k as mk

    for fn, sig, blocks in ((m8._i8_groups, I8_GROUPS_SIG, 4), (mk._k_groups, K_GROUPS_SIG, 6)):
        asm = asm_of(fn, sig)
        assert len(re.findall(r"vpmaddubsw\s[^\n]*ymm", asm)) >= blocks * 8, fn
        assert len(re.findall(r"vpmaddwd\s[^\n]*ymm", asm)) >= blocks * 8, fn
        assert len(re.findall(r"vpshufb\s[^\n]*ymm", asm)) >= 4, fn
        if fn is mk._k_groups:  # the 4-, 5- and 6-bit codes' pair sums add in i16 before one vpmaddwd
            assert len(re.findall(r"vpmaddwd\s", asm)) < len(re.findall(r"vpmaddubsw\s", asm)), fn
        gathers = re.findall(r"^\s*(v\w*gather\w*)\s", asm, re.MULTILINE)
        if fn is m8._i8_groups:
            assert not gathers
        else:  # the IQ2 / IQ3 / IQ1 grids' words, staged once per block
            assert set(gathers) <= {"vpgatherdd", "vpgatherdq"} and len(gathers) >= 8, sorted(set(gathers))


def test_attention_has_no_gathers() -> None:
    """The tiled attention's loops read contiguous rows: the keys' scores as vector FMAs over 16
    keys converted once per chunk (vcvtph2ps), the weighted value sums as vector FMAs over
    converted value rows; never gathers."""
    from edge_infer.kernels_cpu import attention_tiles as at

    f2, cache = nt.Array(nt.float32, 2, "C"), nt.Array(nt.uint16, 4, "C")
    scales, tables = nt.Array(nt.float32, 3, "C"), nt.Array(nt.int32, 2, "C")
    vec, i32 = nt.Array(nt.float32, 1, "C"), nt.Array(nt.int32, 1, "C")
    i64 = nt.int64
    sig = (f2, i64, i64, i64, i64, i64, nt.int32, tables, cache, scales, cache, scales, i32, nt.float32, i64,
           nt.float32, vec, f2, vec, vec, vec, f2, f2, vec, f2)
    asm = asm_of(at._attend_tile, sig)
    assert uses(asm, "vfmadd", VREG) and uses(asm, "vcvtph2ps", VREG)
    assert "gather" not in asm


def test_block_kv_keys_are_transposed_in_registers() -> None:
    """A quantized K pool's chunk of 16 keys: its decoded rows made the scores' lanes by vector
    shuffles (simd_attn.transpose16: 64 of them per 16 dimensions), not by gathers and scatters
    of single floats (the tile before had 416 qword gathers and 294 scatters)."""
    from edge_infer.kernels_cpu import attention_tiles as at

    f2, rows, aux = nt.Array(nt.float32, 2, "C"), nt.Array(nt.uint8, 4, "C"), nt.Array(nt.int64, 1, "C")
    tables, vec, i32, i64 = nt.Array(nt.int32, 2, "C"), nt.Array(nt.float32, 1, "C"), nt.Array(nt.int32, 1, "C"), nt.int64
    sig = (f2, i64, i64, i64, i64, i64, nt.int32, tables, rows, aux, rows, aux, i32, nt.float32, i64,
           nt.float32, vec, f2, vec, vec, vec, f2, f2, vec, f2)
    asm = asm_of(at._attend_tile, sig)
    assert len(re.findall(r"^\s*v(?:perm|unpck|shuf)\w*\s", asm, re.MULTILINE)) >= 64
    assert "vgatherqps" not in asm and "decode_kv_rows" in asm  # the chunk's rows: one call
