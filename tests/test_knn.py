"""kNN kernels (fedjax_pfl/kernels/knn.py) against float64 NumPy brute force."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.kernels import knn


def _memory(seed=0, q=13, n_max=40, n=31, d=7):
    rng = np.random.default_rng(seed)
    queries = rng.normal(size=(q, d)).astype(np.float32)
    keys = rng.normal(size=(n_max, d)).astype(np.float32)
    keys[n:] = 0.0  # padding rows sit at the origin: close to everything, must never be chosen
    labels = rng.integers(0, 5, size=n_max).astype(np.int32)
    return queries, keys, labels, np.arange(n_max) < n


def _brute_force(queries, keys, valid, k):
    q, kk = queries.astype(np.float64), keys[valid].astype(np.float64)
    d = np.array([[np.sum((qi - kj) ** 2) for kj in kk] for qi in q])
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), np.flatnonzero(valid)[order]


@pytest.mark.parametrize("k", [1, 4, 31])
def test_neighbours_equal_float64_brute_force(k):
    queries, keys, labels, valid = _memory()
    dist, index = knn.nearest_neighbours(jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(valid), k)
    ref_dist, ref_index = _brute_force(queries, keys, valid, k)
    np.testing.assert_array_equal(np.asarray(index), ref_index)
    np.testing.assert_allclose(np.asarray(dist), ref_dist, rtol=1e-5, atol=1e-5)


def test_fewer_valid_keys_than_k_leaves_infinite_slots_of_zero_weight():
    queries, keys, labels, _ = _memory()
    valid = np.arange(keys.shape[0]) < 3
    dist, index = knn.nearest_neighbours(jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(valid), 5)
    assert np.all(np.isinf(np.asarray(dist)[:, 3:])) and np.all(np.asarray(index)[:, :3] < 3)
    p = knn.label_distribution(dist, jnp.asarray(labels)[index], 5, 7.0)
    ref = _reference_distribution(np.asarray(dist)[:, :3], labels[np.asarray(index)[:, :3]], 5, 7.0)
    np.testing.assert_allclose(np.asarray(p), ref, rtol=1e-5, atol=1e-6)
    empty = knn.knn_probabilities(jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(labels),
                                  jnp.zeros(keys.shape[0], bool), 3, 5, 7.0)
    assert np.all(np.asarray(empty) == 0.0)


def _reference_distribution(dist, labels, num_classes, bandwidth):
    """The authors' gather_knn_outputs, float64: sum of exp(-d/bw) per class / sum of all."""
    w = np.exp(-np.asarray(dist, np.float64) / bandwidth)
    out = np.zeros((dist.shape[0], num_classes))
    for c in range(num_classes):
        out[:, c] = (w * (labels == c)).sum(axis=1)
    return out / w.sum(axis=1, keepdims=True)


def test_label_distribution_equals_the_authors_kernel_in_float64():
    queries, keys, labels, valid = _memory(1)
    p = knn.knn_probabilities(jnp.asarray(queries), jnp.asarray(keys), jnp.asarray(labels), jnp.asarray(valid),
                              6, 5, 7.0)
    dist, index = _brute_force(queries, keys, valid, 6)
    np.testing.assert_allclose(np.asarray(p), _reference_distribution(dist, labels[index], 5, 7.0), rtol=1e-5,
                               atol=1e-6)
    # far-away queries: exp(-d/bw) underflows to 0 in float32, the normalised weights must not
    # (tolerance: the float32 ulp of d + 1e4 is 1e-3)
    far = knn.label_distribution(jnp.asarray(dist, jnp.float32) + 1e4, jnp.asarray(labels[index]), 5, 7.0)
    assert np.all(np.exp(-(dist + 1e4) / 7.0) == 0.0)
    np.testing.assert_allclose(np.asarray(far), _reference_distribution(dist, labels[index], 5, 7.0), atol=3e-4)


@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_mixture_in_log_space_equals_the_float64_mixture(weight):
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(6, 5)) * 3
    p_knn = rng.dirichlet(np.ones(5), size=6)
    got = np.exp(np.asarray(knn.mix_log_probabilities(jnp.asarray(p_knn, jnp.float32), jnp.asarray(logits,
                                                      jnp.float32), weight)))
    soft = np.exp(logits - logits.max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    np.testing.assert_allclose(got, weight * p_knn + (1 - weight) * soft, rtol=1e-5, atol=1e-6)
