"""Spectral clustering of a precomputed affinity matrix (normalized cut, Yu-Shi discretization).

FedFomo's authors group their clients into "sub-federations" by spectral
clustering of the client-to-client affinity matrix (scikit-learn's
``SpectralClustering(affinity='precomputed', assign_labels='discretize')``).
This is that algorithm as pure, jit-able JAX on a dense [N, N] matrix:

1. `spectral_embedding`: with A the affinity with its diagonal ignored and
   d its row sums, the k eigenvectors of D^-1/2 A D^-1/2 with the largest
   eigenvalues (the smallest of the normalized Laplacian), each divided
   row-wise by sqrt(d): the relaxed normalized-cut solution u = D^-1/2 x.
   A client with no affinity to anyone counts as degree 1.
2. `discretize`: Yu and Shi (ICCV 2003), "Multiclass spectral clustering":
   columns scaled to norm sqrt(N) with a non-positive first entry, rows to unit
   length; a rotation started from one random row and then, column by
   column, the row least aligned with those taken so far; then alternate
   labels = argmax(V R) and R = W U^T from the SVD U S W^T of onehot^T V
   until the cut value 2 (N - sum S) stops changing or 21 label assignments
   were made (scikit-learn's ``n_iter_max=20``).

Eigenvectors of repeated eigenvalues are defined only up to a rotation, so
on such a matrix (an affinity that has not separated yet) another solver
may return another, equally valid, partition; scikit-learn's own result
then depends on its ARPACK start vector. Labels are in [0, k); a label may
be unused.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ITERATIONS = 21  # label assignments at most: scikit-learn's n_iter_max=20 plus the one that stops


def spectral_embedding(affinity, num_clusters: int):
    """[N, k] relaxed normalized-cut embedding of a symmetric non-negative ``affinity`` [N, N].

    Examples:
        >>> blocks = jnp.kron(jnp.eye(2), jnp.ones((2, 2)))  # two disconnected pairs
        >>> e = spectral_embedding(blocks, 2)
        >>> bool(jnp.allclose(e[0], e[1], atol=1e-5) and jnp.allclose(e[2], e[3], atol=1e-5))
        True
    """
    a = jnp.asarray(affinity, jnp.float32)
    a = a * (1.0 - jnp.eye(a.shape[0], dtype=a.dtype))  # the graph Laplacian ignores self-loops
    degree = jnp.sum(a, axis=1)
    root = jnp.sqrt(jnp.where(degree > 0, degree, 1.0))
    normalized = a / root[:, None] / root[None, :]
    _, vectors = jnp.linalg.eigh(normalized)  # ascending eigenvalues
    return vectors[:, ::-1][:, :num_clusters] / root[:, None]


def _unit_rows(embedding):
    """Columns scaled to norm sqrt(N) with a non-positive first entry, then rows to unit length."""
    n = embedding.shape[0]
    tiny = jnp.finfo(embedding.dtype).tiny  # a zero column or row (an isolated client) stays zero
    columns = embedding / jnp.maximum(jnp.linalg.norm(embedding, axis=0, keepdims=True), tiny) * jnp.sqrt(float(n))
    columns = columns * jnp.where(columns[0] != 0, -jnp.sign(columns[0]), 1.0)
    return columns / jnp.maximum(jnp.linalg.norm(columns, axis=1, keepdims=True), tiny)


def _initial_rotation(vectors, first):
    """[k, k] columns: row ``first`` of ``vectors``, then each time the row least aligned with those taken."""
    n, k = vectors.shape
    rotation = jnp.zeros((k, k), vectors.dtype).at[:, 0].set(vectors[first])
    alignment = jnp.zeros((n,), vectors.dtype)
    for j in range(1, k):
        alignment = alignment + jnp.abs(vectors @ rotation[:, j - 1])
        rotation = rotation.at[:, j].set(vectors[jnp.argmin(alignment)])
    return rotation


def discretize(embedding, key):
    """int32 [N] labels in [0, k) for an [N, k] spectral ``embedding`` (Yu-Shi); ``key`` picks the start row.

    Examples:
        >>> blocks = jnp.kron(jnp.eye(3), jnp.ones((2, 2)))  # three disconnected pairs
        >>> labels = discretize(spectral_embedding(blocks, 3), jax.random.key(0))
        >>> len(set(labels.tolist())), bool(labels[0] == labels[1] and labels[4] == labels[5])
        (3, True)
    """
    return discretize_from(embedding, jax.random.randint(key, (), 0, embedding.shape[0]))


def discretize_from(embedding, first_row):
    """`discretize` with the rotation started from row ``first_row`` (int) of the normalised embedding.

    Examples:
        >>> pairs = spectral_embedding(jnp.kron(jnp.eye(2), jnp.ones((2, 2))), 2)
        >>> labels = discretize_from(pairs, 0)
        >>> bool(labels[0] == labels[1] and labels[2] == labels[3] and labels[0] != labels[2])
        True
    """
    vectors = _unit_rows(embedding)
    n, k = vectors.shape
    rotation = _initial_rotation(vectors, first_row)
    tolerance = jnp.finfo(vectors.dtype).eps

    def step(iteration, state):
        rotation, last_cut, done, labels = state
        new_labels = jnp.argmax(vectors @ rotation, axis=1).astype(jnp.int32)
        u, s, wt = jnp.linalg.svd(jax.nn.one_hot(new_labels, k, dtype=vectors.dtype).T @ vectors)
        cut = 2.0 * (n - jnp.sum(s))
        stop = (jnp.abs(cut - last_cut) < tolerance) | (iteration + 1 >= ITERATIONS)
        labels = jnp.where(done, labels, new_labels)
        keep = done | stop
        rotation = jnp.where(keep, rotation, wt.T @ u.T)
        last_cut = jnp.where(keep, last_cut, cut)
        return rotation, last_cut, keep, labels

    start = (rotation, jnp.zeros((), vectors.dtype), jnp.zeros((), bool), jnp.zeros((n,), jnp.int32))
    return jax.lax.fori_loop(0, ITERATIONS, step, start)[3]


def spectral_clusters(affinity, num_clusters: int, key):
    """int32 [N] cluster labels of a symmetric non-negative ``affinity`` [N, N] (normalized cut).

    Examples:
        >>> blocks = jnp.kron(jnp.eye(2), jnp.ones((3, 3))) + 0.01  # two groups, weakly linked
        >>> labels = spectral_clusters(blocks, 2, jax.random.key(1))
        >>> bool(len(set(labels[:3].tolist())) == 1 and len(set(labels[3:].tolist())) == 1 and labels[0] != labels[3])
        True
    """
    return discretize(spectral_embedding(affinity, num_clusters), key)
