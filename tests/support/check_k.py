"""Checks of the K-quant int8 matmul (kernels_cpu.matmul_k), shared by its tests and the
portable subprocess runs (the generic target compiles its plain-IR stand-in for vpdpbusd, the AVX2 one
vpmaddubsw)."""

from __future__ import annotations

import numpy as np
from kernel_data import random_rows

from edge_infer.formats.weight_types import TYPES, weight_type
from edge_infer.kernels_cpu import matmul_k as mk
from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.backend import quantize_rows
from edge_infer.kernels_cpu.matmul_i8 import quantize_rows_q8
from edge_infer.kernels_cpu.repack_k import FILE_BYTES, K_FORMATS, KWeights, repack_k

K_TYPES = tuple(t.id for t in TYPES if t.k is not None)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x float32 [T, K] -> the kernel's activations (xq4, xd, xs16)."""
    t, k = x.shape
    xq4, xd, xs16 = np.empty((t, k // 4), np.int32), np.empty((t, k // 32), np.float32), np.empty((t, k // 16), np.int32)
    quantize_rows_q8(np.ascontiguousarray(x), xq4, xd, xs16)
    return xq4, xd, xs16


def run(kw: KWeights, act: tuple, rows: int, threads: int, t: slice | None = None) -> np.ndarray:
    xq4, xd, xs16 = (a if t is None else np.ascontiguousarray(a[t]) for a in act)
    out = np.full((xq4.shape[0], rows), np.nan, np.float32)
    mk.matmul_k_kernel(xq4, xd, xs16, *kw.args, out, threads)
    return out


def check_k(rng: np.random.Generator) -> None:
    """Per K-quant type: the repacked record is the file's size, the twin's codes decode to the
    reference dequantizer's values, the kernel equals the NumPy twin bit for bit, is close to
    the float64 product, and is batch and thread invariant; the fused three-matrix launch gives
    the same bits."""
    rows, k, n = 37, 512, 7  # rows not a multiple of 16; 2 super-blocks; 7 tokens: a tile of 4 + a padded tile of 3
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[1] = 0.0  # an all-zero token: scale 0
    x[2, :256] *= 50.0  # super-blocks of very different ranges
    act = quantize(x)
    xq, xd, xs16 = ref.quantize_q8_16(x)
    np.testing.assert_array_equal(act[0].view(np.int8).reshape(n, k), xq)
    np.testing.assert_array_equal(act[1], xd)
    np.testing.assert_array_equal(act[2], xs16)
    for mine, theirs in zip(act[:2], quantize_rows(x)[:2]):  # the same codes as the other int8 matrices
        np.testing.assert_array_equal(mine, theirs)
    xdeq = (xq.astype(np.float64).reshape(n, -1, 32) * xd[:, :, None]).reshape(n, k)
    mats = []
    for qtype in K_TYPES:
        w = random_rows(qtype, rows, k, rng, edge=False)
        kw = repack_k(w, qtype, rows, k)
        form = weight_type(qtype).k
        assert form is not None
        per16 = form.grid is not None and form.grid.scale_cols == 16
        table, ternary = form.table is not None or (form.grid is not None and not per16), form.bits == 2
        # the file's bytes per 16 rows (IQ4_XS: + its unpacked 8-bit scales; TQ1_0: base-3 digits as 2 bits;
        # the grid types' eighth sign bits)
        assert kw.wk.shape[2] == K_FORMATS[qtype][0] and 16 * FILE_BYTES[qtype] <= kw.wk.shape[2] <= 20 * FILE_BYTES[qtype]
        codes, sc, mn, d, dmin = ref.k_codes(w, qtype)
        width = 16 if mn is None and not (table or ternary) else 32
        scale = np.repeat(sc, width, axis=-1).reshape(rows, k).astype(np.float64) * np.repeat(d, 256, axis=1)
        if table or ternary:
            values = scale * (codes - (128 if table else 1))
        elif mn is None:
            values = scale * (codes - (128 if per16 else 32))
        else:
            values = scale * codes - np.repeat(mn, 32, axis=-1).reshape(rows, k) * np.repeat(dmin, 256, axis=1)
        dense = ref.decode_rows(w, qtype).astype(np.float64)
        np.testing.assert_allclose(values, dense, rtol=1e-6, atol=1e-6 * np.abs(dense).max(), err_msg=f"codes {qtype}")
        got = run(kw, act, rows, 2)
        np.testing.assert_array_equal(got, ref.matmul_k(xq, xd, xs16, w, qtype), err_msg=f"twin {qtype}")
        bound = np.abs(xdeq) @ np.abs(dense).T
        assert np.all(np.abs(got - xdeq @ dense.T) <= 1e-5 * bound + 1e-6), qtype
        assert np.all(got[1] == 0.0)
        for t0, m in ((0, 3), (3, 3), (0, 2), (1, 6)):  # tiles of 3 (padded to four), of 2, of 4 + 2
            np.testing.assert_array_equal(run(kw, act, rows, 2, slice(t0, t0 + m)), got[t0 : t0 + m])
        # one thread: its GEMM runs groups 0 and 1 as a pair (kernels_cpu.simd_tile.k_pair_tile), group 2 alone
        np.testing.assert_array_equal(run(kw, act, rows, 1), got)
        for t in range(n):  # a token alone, with 1 or 3 threads, gives the identical row
            np.testing.assert_array_equal(run(kw, act, rows, 1, slice(t, t + 1))[0], got[t])
            np.testing.assert_array_equal(run(kw, act, rows, 3, slice(t, t + 1))[0], got[t])
        mats.append((kw, got))
    for fused in (mats[:3], mats[-3:]):  # three matrices per launch
        outs = [np.full((n, rows), np.nan, np.float32) for _ in fused]
        xbuf = tuple(np.empty_like(a) for a in act)
        args: list[object] = [x, *xbuf]
        for (kw, _), o in zip(fused, outs):
            args += [*kw.args, o]
        mk.matmul3_k_kernel(*args, 2)
        for (_, want), o in zip(fused, outs):
            np.testing.assert_array_equal(o, want)
