"""FedCAC kernels (fedjax_pfl/kernels/critical_params.py) against float64 double loops
written after the authors' code (Fling's fedcac_client / fedcac_group)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.kernels import critical_params


def np_critical_mask(values, tau):
    """evaluate_critical_parameter for one tensor, float64."""
    metric = np.asarray(values, np.float64).reshape(-1)
    nz = int(tau * metric.size)
    thresh = np.sort(metric)[::-1][nz - 1] if nz > 0 else np.inf
    if thresh <= 1e-10:
        nonzero = metric[metric > 1e-20]
        if nonzero.size:
            thresh = np.sort(nonzero)[0]
    return np.asarray(values) >= thresh


@pytest.mark.parametrize("tau", [0.0, 0.1, 0.5, 1.0])
def test_critical_mask_is_the_per_tensor_top_fraction(tau):
    rng = np.random.default_rng(0)
    values = np.abs(rng.normal(size=(7, 9))).astype(np.float32)
    values[0, :3] = values[1, 0]  # ties at various places
    got = np.asarray(critical_params.critical_mask(jnp.asarray(values), tau))
    np.testing.assert_array_equal(got, np_critical_mask(values, tau))
    assert got.sum() >= int(tau * values.size)


def test_zero_threshold_takes_the_smallest_nonzero_and_all_zero_marks_everything():
    values = np.zeros(10, np.float32)
    values[[2, 5]] = [3.0, 1e-3]
    got = np.asarray(critical_params.critical_mask(jnp.asarray(values), 0.5))  # 5th largest is 0
    np.testing.assert_array_equal(got, np_critical_mask(values, 0.5))
    np.testing.assert_array_equal(np.flatnonzero(got), [2, 5])
    np.testing.assert_array_equal(np.asarray(critical_params.critical_mask(jnp.zeros(4), 0.5)), np.ones(4, bool))


def test_sensitivity_and_masks_per_leaf():
    rng = np.random.default_rng(1)
    start = {"a": rng.normal(size=(4, 3)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)}
    trained = jax.tree.map(lambda a: (a + rng.normal(size=a.shape) * 0.1).astype(np.float32), start)
    s = critical_params.sensitivity(jax.tree.map(jnp.asarray, trained), jax.tree.map(jnp.asarray, start))
    masks = critical_params.critical_masks(s, 0.4)
    for k in start:
        t, r = trained[k].astype(np.float64), start[k].astype(np.float64)
        ref = np.abs((t - r) * t)
        np.testing.assert_allclose(np.asarray(s[k]), ref, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(masks[k]), np_critical_mask(ref, 0.4))


def np_server(masks, models, active, round_index, beta):
    """get_customized_global_models over the active clients, float64 double loops."""
    n = masks.shape[0]
    overlap = np.full((n, n), np.nan)
    for i in range(n):
        for j in range(n):
            if i != j:
                overlap[i, j] = 1 - np.abs(masks[i] - masks[j]).sum() / (masks[i].sum() * 2.0)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j and active[i] and active[j]]
    vals = np.array([overlap[p] for p in pairs])
    threshold = vals.mean() + (round_index + 1) / beta * (vals.max() - vals.mean())
    customized = np.zeros_like(models)
    for i in range(n):
        group = [i] + [j for j in range(n) if j != i and active[j] and active[i] and overlap[i, j] >= threshold]
        customized[i] = sum(models[j] for j in group) / len(group)
    return overlap, threshold, customized


@pytest.mark.parametrize("round_index", [0, 3, 9])
def test_overlap_threshold_and_customized_models_equal_double_loops(round_index):
    rng = np.random.default_rng(2)
    n, p = 6, 50
    masks = rng.random((n, p)) < rng.uniform(0.2, 0.7, size=(n, 1))  # unequal sizes: o is not symmetric
    masks[1] = masks[0] | (rng.random(p) < 0.1)  # one close pair
    models = rng.normal(size=(n, p)) + 3.0
    active = np.array([True, True, True, False, True, True])
    overlap = np.asarray(critical_params.overlap_rates(jnp.asarray(masks)))
    ref_overlap, ref_threshold, ref_customized = np_server(masks.astype(np.float64), models, active, round_index, 10)
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(overlap[off], ref_overlap[off], rtol=1e-6)
    threshold = critical_params.collaboration_threshold(jnp.asarray(overlap), jnp.asarray(active), round_index, 10.0)
    np.testing.assert_allclose(float(threshold), ref_threshold, rtol=1e-5)
    weights = critical_params.collaboration_weights(jnp.asarray(overlap), jnp.asarray(active), threshold)
    customized = critical_params.customized_models(weights, jnp.asarray(models, jnp.float32))
    np.testing.assert_allclose(np.asarray(customized), ref_customized, rtol=1e-5, atol=1e-5)
    assert not np.allclose(ref_customized, models)  # someone collaborates
    np.testing.assert_allclose(np.asarray(customized)[3], models[3], rtol=1e-6)  # inactive: only itself


def test_merge_takes_critical_entries_from_the_customized_model():
    mask = {"w": jnp.array([[True, False], [False, True]])}
    out = critical_params.merge(mask, {"w": jnp.full((2, 2), 1.0)}, {"w": jnp.array([5.0, 6.0])})
    np.testing.assert_array_equal(np.asarray(out["w"]), [[1.0, 6.0], [5.0, 1.0]])
