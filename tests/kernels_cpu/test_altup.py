"""gemma3n's AltUp and sparsity kernels against their NumPy twins, and each token's result
independent of the other rows of the batch."""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.kernels_cpu import altup, reference_altup

A, T, D, F = 4, 7, 48, 96


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return dict(streams=rng.normal(0, 1, (A, T, D)).astype(f32), r=rng.normal(0, 1.5, (T, A)).astype(f32),
                pcoef=rng.normal(0, 0.5, (A * A, A)).astype(f32), ccoef=rng.normal(0, 0.5, (A, A)).astype(f32),
                y=rng.normal(0, 1, (T, D)).astype(f32), x=rng.normal(0, 2, (T, D)).astype(f32),
                g=rng.normal(0.3, 1, (T, F)).astype(f32))


def test_predict_and_correct_match_their_twins() -> None:
    d = _data()
    pred, active = np.empty_like(d["streams"]), np.empty((T, D), np.float32)
    altup.altup_predict_kernel(d["streams"], d["r"], d["pcoef"], pred, active)
    ref = reference_altup.altup_predict(d["streams"], d["r"], d["pcoef"])
    np.testing.assert_allclose(pred, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(active, pred[0])
    out = np.empty_like(pred)
    altup.altup_correct_kernel(pred, d["y"], d["r"], d["ccoef"], out)
    np.testing.assert_allclose(out, reference_altup.altup_correct(pred, d["y"], d["r"], d["ccoef"]), rtol=1e-5,
                               atol=1e-5)
    # a predicted stream mixes every stream: changing stream 3 moves stream 1's prediction
    changed = d["streams"].copy()
    changed[3] += 1.0
    pred2 = np.empty_like(pred)
    altup.altup_predict_kernel(changed, d["r"], d["pcoef"], pred2, active)
    assert np.abs(pred2[1] - pred[1]).max() > 1e-2


def test_norms_means_sparsity_and_scales_match_their_twins() -> None:
    d = _data(1)
    x = d["x"].copy()
    altup.match_norm_kernel(d["y"], x)
    np.testing.assert_allclose(x, reference_altup.match_norm(d["y"], d["x"]), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), np.linalg.norm(d["y"], axis=1), rtol=1e-5)
    mean = np.empty((T, D), np.float32)
    altup.unembed_mean_kernel(d["y"], d["streams"], mean)
    np.testing.assert_allclose(mean, reference_altup.unembed_mean(d["y"], d["streams"]), rtol=1e-5, atol=1e-6)
    g = d["g"].copy()
    altup.gaussian_topk_kernel(g, np.float32(1.6448533535003662))
    ref = reference_altup.gaussian_topk(d["g"], 1.6448533535003662)
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-5)
    kept = (g > 0).mean()
    assert 0.01 < kept < 0.15  # about 5% of a normal row is above its 1.645-sigma cutoff
    w, out = d["y"][0].copy(), np.empty((T, D), np.float32)
    altup.mul_rows_kernel(d["x"], w, out)
    np.testing.assert_allclose(out, reference_altup.mul_rows(d["x"], w), rtol=1e-6)


@pytest.mark.parametrize("rows", [slice(0, 1), slice(2, 5)])
def test_a_token_does_not_depend_on_the_batch(rows: slice) -> None:
    d = _data(2)
    pred, active = np.empty_like(d["streams"]), np.empty((T, D), np.float32)
    altup.altup_predict_kernel(d["streams"], d["r"], d["pcoef"], pred, active)
    sub = np.ascontiguousarray(d["streams"][:, rows])
    pred_s, active_s = np.empty_like(sub), np.empty((sub.shape[1], D), np.float32)
    altup.altup_predict_kernel(sub, np.ascontiguousarray(d["r"][rows]), d["pcoef"], pred_s, active_s)
    np.testing.assert_array_equal(pred_s, pred[:, rows])
    g_all, g_sub = d["g"].copy(), np.ascontiguousarray(d["g"][rows])
    altup.gaussian_topk_kernel(g_all, np.float32(1.5))
    altup.gaussian_topk_kernel(g_sub, np.float32(1.5))
    np.testing.assert_array_equal(g_sub, g_all[rows])
