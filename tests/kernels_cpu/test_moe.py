"""Mixture-of-experts kernels: routing against its NumPy twin; grouped expert matmuls of every
weight form equal to dense matmuls of each token with its expert's matrix, bit for bit, for any
batch and thread count; experts no token chose are never read."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quantize
from kernel_data import random_rows

from edge_infer.formats.qmatrix import QMatrix
from edge_infer.kernels_cpu import dequant as dq
from edge_infer.kernels_cpu import reference as ref
from edge_infer.kernels_cpu.backend import CpuBackend
from edge_infer.kernels_cpu.repack_i8 import I8Weights
from edge_infer.kernels_cpu.repack_k import KWeights
from edge_infer.kernels_cpu.workspace import make_workspace

E, K_USED, D, FE = 6, 2, 256, 48  # FE: three 16-row groups per expert


class _File:
    """The part of GGUFFile that prepare_weights touches."""

    tensors: dict[str, object] = {}

    def drop_pages(self, t: object) -> None:
        pass


def _stack(qtype: int, rows: int, cols: int, rng: np.random.Generator, backend: CpuBackend) -> QMatrix:
    data = random_rows(qtype, E * rows, cols, rng, edge=False).reshape(E, rows, -1)
    _File.tensors["w"] = None
    return backend.prepare_weights(_File(), [("layer", QMatrix("w", data, qtype, rows, cols))])[0]


def _router(rng: np.random.Generator, backend: CpuBackend, qtype: int = dq.F32) -> QMatrix:
    """A router whose expert 0 no positive input (x >= 0) chooses."""
    r = rng.standard_normal((E, D)).astype(np.float32) * 0.1
    r[0] = -1.0
    data = r.view(np.uint8) if qtype == dq.F32 else quantize(r, GGMLQuantizationType(qtype))
    _File.tensors["w"] = None
    return backend.prepare_weights(_File(), [("layer", QMatrix("w", data, qtype, E, D))])[0]


def _route(backend: CpuBackend, ws, x: np.ndarray, rng: np.random.Generator, norm: bool = True,  # type: ignore[no-untyped-def]
           qtype: int = dq.F32) -> None:
    backend.route_experts(_router(rng, backend, qtype), x, norm, ws)


def test_routing_matches_twin_and_groups_pairs_by_expert() -> None:
    rng = np.random.default_rng(0)
    backend, n = CpuBackend(2), 37
    ws = make_workspace(n, D, D, D, FE, (E, K_USED, FE))
    x = np.abs(rng.standard_normal((n, D))).astype(np.float32)
    # F32: in the kernel; Q8_0: a matmul; sigmoid probabilities with a selection bias (lfm2moe)
    bias = np.array([0.0, 0.0, 0.4, 0.0, -0.4, 0.0], np.float32)
    # gating 2: gpt-oss's softmax over the chosen logits
    for norm, qtype, gating, b in ((True, dq.F32, 0, None), (False, dq.F32, 0, None), (True, dq.Q8_0, 0, None),
                                   (True, dq.F32, 1, bias), (False, dq.F32, 1, None), (False, dq.F32, 2, None)):
        router = _router(rng, backend, qtype)
        if b is None:
            backend.route_experts(router, x, norm, ws, gating)
        else:
            backend.route_experts(router, x, norm, ws, gating, b)
        m = ws.moe
        if qtype == dq.F32:
            np.testing.assert_allclose(m.logits[:n], x @ router.data.view(np.float32).T, rtol=1e-4, atol=1e-4)
        sel, wts = ref.route(m.logits[:n], K_USED, norm, gating, b)
        if b is not None:  # the bias changes the choice, not the weights
            unbiased, _ = ref.route(m.logits[:n], K_USED, norm, gating)
            assert (sel != unbiased).any()
        assert 0 not in sel
        np.testing.assert_array_equal(m.sel[:n], sel)
        np.testing.assert_allclose(m.wts[:n], wts, rtol=1e-6)
        assert (np.diff(m.offsets) == np.bincount(sel.ravel(), minlength=E)).all()
        for t in range(n):
            for j in range(K_USED):
                p = m.pair_of[t, j]
                assert m.pair_token[p] == t and m.offsets[sel[t, j]] <= p < m.offsets[sel[t, j] + 1]
        np.testing.assert_array_equal(m.xg[: n * K_USED], x[m.pair_token[: n * K_USED]])


FORMS = {"F32": dq.F32, "F16": dq.F16, "Q8_0": dq.Q8_0, "Q4_1": dq.Q4_1, "Q5_0": dq.Q5_0, "Q4_K": dq.Q4_K,
         "Q5_K": dq.Q5_K, "Q6_K": dq.Q6_K}


@pytest.mark.parametrize("name", list(FORMS))
def test_grouped_matmul_equals_dense_per_expert(name: str) -> None:
    qtype = FORMS[name]
    rng = np.random.default_rng(1)
    backend = CpuBackend(2)
    gate, up = _stack(qtype, FE, D, rng, backend), _stack(qtype, FE, D, rng, backend)
    expected_form = KWeights if qtype in (dq.Q4_K, dq.Q5_K, dq.Q6_K) else (I8Weights if qtype in (dq.Q8_0, dq.Q4_1, dq.Q5_0) else type(None))
    assert isinstance(gate.packed, expected_form)
    results = []
    for n, threads in ((9, 2), (9, 1), (1, 2)):
        backend = CpuBackend(threads)
        ws = make_workspace(16, D, D, D, FE, (E, K_USED, FE))
        x = np.abs(np.random.default_rng(2).standard_normal((9, D))).astype(np.float32)[:n]
        _route(backend, ws, x, np.random.default_rng(3))
        p = n * K_USED
        g, u = np.full((p, FE), np.nan, np.float32), np.full((p, FE), np.nan, np.float32)
        backend.expert_matmuls(ws.moe.xg[:p], (gate, up), (g, u), ws)
        sel = ws.moe.sel[:n]
        dense = make_workspace(1, D, D, D, FE)
        for t in range(n):
            for j in range(K_USED):
                e, row = sel[t, j], ws.moe.pair_of[t, j]
                for stack, out in ((gate, g), (up, u)):
                    want = np.empty((1, FE), np.float32)
                    backend.matmuls(x[t : t + 1], (_expert(stack, e),), (want,), dense)
                    np.testing.assert_array_equal(out[row], want[0], err_msg=f"{name} token {t} expert {e}")
        results.append(g[ws.moe.pair_of[:1, 0]])
    np.testing.assert_array_equal(results[0], results[1])  # any thread count
    np.testing.assert_array_equal(results[0], results[2])  # alone or in a batch


def _expert(stack: QMatrix, e: int) -> QMatrix:
    """Expert e of a stack as a plain matrix in the same form."""
    pk = stack.packed
    if isinstance(pk, KWeights):
        pk = KWeights(pk.wk[e], pk.qtype)
    elif isinstance(pk, I8Weights):
        pk = I8Weights(pk.wi[e], pk.wd[e], pk.wm[e] if pk.wm.shape[1] else np.empty((0, 0, 0), np.uint16), pk.offset,
                       pk.fmt)
    return QMatrix(stack.name, stack.data[e], stack.qtype, stack.rows, stack.cols, pk)


@pytest.mark.parametrize("name", ["F32", "Q8_0", "Q4_K"])
def test_unchosen_experts_are_not_read(name: str) -> None:
    """Expert 0, which no token picks, is filled with NaN scales: no output sees them."""
    qtype = FORMS[name]
    rng = np.random.default_rng(4)
    backend = CpuBackend(2)
    down = _stack(qtype, D, FE if qtype == dq.F32 else 256, rng, backend)
    pk = down.packed
    for a in ([down.data] if pk is None else [pk.wk] if isinstance(pk, KWeights) else [pk.wi, pk.wd]):
        a[0] = 0xFF  # f16/f32 NaN bit patterns in the scales (and the float data)
    width = down.cols
    ws = make_workspace(8, D, D, D, width, (E, K_USED, width))
    x = np.abs(rng.standard_normal((8, D))).astype(np.float32)
    _route(backend, ws, x, rng)
    y = np.empty((16, D), np.float32)
    a = rng.standard_normal((16, width)).astype(np.float32)
    backend.expert_matmuls(a, (down,), (y,), ws)
    assert np.isfinite(y).all()
