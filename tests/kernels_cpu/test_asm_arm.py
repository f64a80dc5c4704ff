"""aarch64 only: the int8 block dot products (the grid formats' too, staged as 8-bit codes from
words loaded one row at a time) compile to `sdot` on a CPU with the dot-product
extension (a Cortex-A76 under qemu in CI: scripts/arm_check.sh), with no widening-multiply
chain, and give the integers of their definition (the twin comparison of the whole kernel is
tests/kernels_cpu/test_matmul_i8.py); the float path's F16 decode and GEMM are NEON vector
code (fcvtl, fmla on v registers)."""

from __future__ import annotations

import platform
import re

import numba
import numpy as np
import pytest
from asm_helpers import asm_of
from numba import types as nt

from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import matmul as mm
from edge_infer.kernels_cpu import simd_dot, simd_i8, target

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("aarch64", "arm64"), reason="aarch64 only")

U8, I32 = nt.Array(nt.uint8, 1, "C"), nt.Array(nt.int32, 1, "C")


def _one_block(iacc, w, x4):  # type: ignore[no-untyped-def]
    simd_i8.dot_block(iacc, w, 0, x4, 0)


def _one_block_q4(iacc, w, x4):  # type: ignore[no-untyped-def]
    simd_i8.dot_block_q4(iacc, w, 0, x4, 0)


def _one_block_iq4(iacc, w, x4):  # type: ignore[no-untyped-def]
    simd_i8.dot_block_iq4(iacc, w, 0, x4, 0)


def _one_block_q2(iacc, w, x4):  # type: ignore[no-untyped-def]
    simd_i8.dot_block_q2(iacc, w, 0, x4, 0)


def _one_block_iq3s(iacc, w, x4):  # type: ignore[no-untyped-def]
    simd_i8.stage_iq3s(w, 0, w, 512)  # staged as 8-bit codes, then read as the 8-bit format
    simd_i8.dot_block(iacc, w, 0, x4, 0)


def _one_block_iq2xs(iacc, w, x4):  # type: ignore[no-untyped-def]
    simd_i8.stage_iq2xs(w, 0, w, 512)
    simd_i8.dot_block_q8s(iacc, w, 0, x4, 0)


@pytest.mark.skipif(not simd_i8.HAS_SDOT, reason="this CPU has no dot-product extension")
@pytest.mark.parametrize("fn", [_one_block, _one_block_q4, _one_block_iq4, _one_block_q2, _one_block_iq3s, _one_block_iq2xs],
                         ids=["q8", "q4", "iq4", "q2", "iq3s", "iq2xs"])
def test_int8_block_is_sdot(fn) -> None:  # type: ignore[no-untyped-def]
    print(f"LLVM CPU {target.cpu_name()}: int8 path {target.int8_isa()}")
    asm = numba.njit((I32, U8, I32), no_cpython_wrapper=True)(fn).inspect_asm((I32, U8, I32))
    n_sdot = len(re.findall(r"\bsdot\b", asm))
    assert n_sdot >= 32, n_sdot  # 8 quads x 4 sdot of 16 bytes for one 16 x 32 block
    if fn is _one_block_iq4:  # the table in a register: tbl, 4 per 64 code bytes
        assert len(re.findall(r"\btbl\b", asm)) >= 16
    assert not re.search(r"\b[su]mull2?\b|\b[su]addlp\b", asm)  # no widening multiply / pairwise-add chain
    assert target.int8_isa() == "NEON sdot"


@pytest.mark.skipif(not simd_i8.HAS_SDOT, reason="this CPU has no dot-product extension")
def test_sdot_sums_equal_the_integer_definition() -> None:
    rng = np.random.default_rng(5)
    w = rng.integers(0, 256, 512, dtype=np.uint8)  # 8-bit format: stored q + 128
    x4 = rng.integers(-127, 128, 8 * 4, dtype=np.int8).view(np.int32)
    iacc = np.zeros(16, np.int32)
    numba.njit(_one_block)(iacc, w, x4)
    q = (w.astype(np.int32) - 128).reshape(8, 16, 4)  # [quad, row lane, byte]
    xs = x4.view(np.int8).astype(np.int32).reshape(8, 4)
    np.testing.assert_array_equal(iacc, np.einsum("qlk,qk->l", q, xs))  # sdot reads q: offset 0
    numba.njit(_one_block_iq4)(iacc, w[:256], x4)  # 4-bit codes: quads 0-3 low nibbles, 4-7 high
    nib = np.concatenate([w[:256] & 15, w[:256] >> 4]).astype(np.int64).reshape(8, 16, 4)
    q = np.array(simd_dot.TABLES[simd_dot.FMT_IQ4])[nib]  # the table's values, signed: offset 0 on sdot
    np.testing.assert_array_equal(iacc, np.einsum("qlk,qk->l", q, xs))


def test_float_path_is_neon_vector_code() -> None:
    u8, f32 = nt.Array(nt.uint8, 2, "C"), nt.Array(nt.float32, 2, "C")
    dec = asm_of(dq.decode_f16, (u8, nt.int64, f32, nt.int64))
    assert re.search(r"\bfcvtl2?\s+v\d+\.4s", dec), "F16 decode: no vector half -> float conversion"
    gemm = asm_of(mm._row_groups, (f32, u8, nt.int64, f32, nt.int64, nt.int64, f32))
    assert re.search(r"\bfmla\s+v\d+\.4s", gemm), "float GEMM: no vector FMA"
