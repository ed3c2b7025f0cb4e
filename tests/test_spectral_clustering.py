"""Spectral clustering kernel (FedFomo's sub-federations): against float64 references and scikit-learn goldens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.kernels.spectral_clustering import (discretize_from, spectral_clusters,
                                                   spectral_embedding)


def noisy_affinity(seed, n, k):
    """A symmetrised row-softmax affinity with k weak groups (as FedFomo's server builds it)."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, k, n)
    w = rng.normal(size=(n, n)) * 0.5 + 0.4 * (groups[:, None] == groups[None, :])
    w = np.exp(w) / np.exp(w).sum(1, keepdims=True)
    return (w + w.T) / 2


def reference_embedding(a, k):
    """float64 numpy: eigenvectors of D^-1/2 A D^-1/2 (self-loops dropped) for the k largest eigenvalues, / sqrt(d)."""
    a = np.array(a, np.float64)
    np.fill_diagonal(a, 0.0)
    root = np.sqrt(a.sum(1))
    _, vectors = np.linalg.eigh(a / root[:, None] / root[None, :])
    return vectors[:, ::-1][:, :k] / root[:, None]


@pytest.mark.parametrize("seed,n,k", [(1, 12, 3), (2, 30, 5)])
def test_embedding_spans_the_float64_reference_subspace(seed, n, k):
    a = noisy_affinity(seed, n, k)
    ours = np.asarray(spectral_embedding(jnp.asarray(a), k), np.float64)
    ref = reference_embedding(a, k)
    # Eigenvectors are defined up to sign: compare the columns' absolute cosines.
    cos = np.abs(np.sum(ours * ref, 0)) / np.linalg.norm(ours, axis=0) / np.linalg.norm(ref, axis=0)
    np.testing.assert_allclose(cos, 1.0, atol=1e-4)
    # The diagonal does not count: the graph Laplacian ignores self-loops.
    with_loops = np.asarray(spectral_embedding(jnp.asarray(a + 5 * np.eye(n)), k))
    np.testing.assert_allclose(np.abs(with_loops), np.abs(ours), atol=1e-5)


# scikit-learn 1.9.1, run once: SpectralClustering(n_clusters=k, affinity="precomputed", n_init=10,
# random_state=0, assign_labels="discretize").fit_predict(noisy_affinity(seed, n, k)); its discretization
# starts from row np.random.RandomState(0) after the n uniforms of its ARPACK start vector.
GOLDEN = [
    (7, 16, 4, 3, [2, 3, 1, 0, 0, 2, 1, 2, 3, 1, 1, 0, 0, 3, 1, 2]),
    (8, 25, 5, 0, [0, 4, 3, 1, 2, 3, 0, 3, 2, 4, 2, 3, 4, 4, 1, 1, 4, 2, 4, 1, 1, 3, 0, 3, 2]),
    (9, 12, 3, 8, [0, 1, 2, 0, 2, 0, 1, 1, 0, 2, 1, 2]),
]


@pytest.mark.parametrize("seed,n,k,first,labels", GOLDEN)
def test_discretization_gives_scikit_learns_labels(seed, n, k, first, labels):
    embedding = spectral_embedding(jnp.asarray(noisy_affinity(seed, n, k)), k)
    assert np.asarray(discretize_from(embedding, first)).tolist() == labels


def test_separated_groups_are_found_whatever_the_start():
    groups = np.repeat(np.arange(4), [3, 5, 2, 6])
    a = np.where(groups[:, None] == groups[None, :], 1.0, 0.02)
    for seed in range(5):
        labels = np.asarray(spectral_clusters(jnp.asarray(a), 4, jax.random.key(seed)))
        # Same partition as the groups: each group one label, four labels.
        assert all(len(set(labels[groups == g])) == 1 for g in range(4))
        assert len(set(labels.tolist())) == 4


def test_jit_and_an_isolated_client():
    a = np.kron(np.eye(2), np.ones((3, 3)))
    a = np.pad(a, ((0, 1), (0, 1)))  # client 6 has no affinity to anyone: degree counted as 1, no NaN
    labels = jax.jit(spectral_clusters, static_argnums=1)(jnp.asarray(a), 3, jax.random.key(0))
    assert labels.dtype == jnp.int32 and labels.shape == (7,)
    assert int(labels.min()) >= 0 and int(labels.max()) < 3
    assert len(set(np.asarray(labels[:3]).tolist())) == 1 and len(set(np.asarray(labels[3:6]).tolist())) == 1
