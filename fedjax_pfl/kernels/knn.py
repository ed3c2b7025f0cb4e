"""Exact k-nearest-neighbour search over a padded memory, and the kNN label
distribution of kNN-Per (Marfoq et al., ICML 2022).

All functions are pure and jit-able, with no loop over queries or keys: the
squared Euclidean distances of Q queries to K keys come from ONE [Q, d] x
[d, K] matmul (``|q|^2 + |k|^2 - 2 q.k``, clamped at 0, ``Precision.HIGHEST``
so accelerators do not drop to TF32), the neighbours from ``lax.top_k``.
Padded memory rows (``valid`` False) are never neighbours.

The label distribution follows the authors' code (``KNNPerClient.
gather_knn_outputs``): neighbour j of a query gets the Gaussian-kernel weight
``exp(-d_j^2 / bandwidth)`` (bandwidth = feature width x length scale in their
code), and p_kNN(c) = sum of the weights of neighbours labelled c / sum of all
weights. The weights are normalised as a softmax over the k neighbours,
which is the same ratio without the underflow of exp(-d^2 / bandwidth) to 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST


def squared_distances(queries, keys):
    """||q_i - k_j||^2, [Q, K], for queries [Q, d] and keys [K, d] (float32 or wider).

    Examples:
        >>> squared_distances(jnp.array([[0.0, 0.0]]), jnp.array([[3.0, 4.0], [1.0, 0.0]])).tolist()
        [[25.0, 1.0]]
    """
    dtype = jnp.promote_types(jnp.result_type(queries, keys), jnp.float32)
    q, k = queries.astype(dtype), keys.astype(dtype)
    cross = jnp.matmul(q, k.T, precision=_HIGHEST)
    sq = jnp.sum(q * q, axis=1)[:, None] + jnp.sum(k * k, axis=1)[None, :] - 2.0 * cross
    return jnp.maximum(sq, 0.0)


def nearest_neighbours(queries, keys, valid, k: int):
    """The ``k`` nearest valid keys of every query -> (squared distances [Q, k], indices [Q, k]).

    Nearest first. ``valid`` [K] bool marks real memory rows; when fewer than
    ``k`` are valid the surplus slots get distance +inf (and any index).
    ``k`` is capped at K.

    Examples:
        >>> keys = jnp.array([[3.0, 4.0], [1.0, 0.0], [0.5, 0.0]])
        >>> dist, index = nearest_neighbours(jnp.array([[0.0, 0.0]]), keys, jnp.array([True, True, False]), k=2)
        >>> dist.tolist(), index.tolist()  # row 2 is padding
        ([[1.0, 25.0]], [[1, 0]])
    """
    k = min(int(k), keys.shape[0])
    d = jnp.where(valid[None, :], squared_distances(queries, keys), jnp.inf)
    neg, index = jax.lax.top_k(-d, k)
    return -neg, index


def label_distribution(distances, neighbour_labels, num_classes: int, bandwidth: float):
    """p_kNN [Q, C] from neighbour squared distances [Q, k] and labels [Q, k].

    Weights exp(-d^2 / bandwidth) normalised over the neighbours; slots at
    distance +inf weigh 0; a query with no finite neighbour gets all zeros.

    Examples:
        >>> import numpy as np
        >>> dist = jnp.array([[1.0, 1.0, jnp.inf]])  # the third slot is empty
        >>> p = label_distribution(dist, jnp.array([[0, 1, 1]]), num_classes=3, bandwidth=1.0)
        >>> print(np.asarray(p).round(3))
        [[0.5 0.5 0. ]]
    """
    logits = -distances / bandwidth
    has = jnp.any(jnp.isfinite(logits), axis=1, keepdims=True)
    w = jax.nn.softmax(jnp.where(has, logits, 0.0), axis=1) * has
    onehot = jax.nn.one_hot(neighbour_labels, num_classes, dtype=w.dtype)
    return jnp.einsum("qk,qkc->qc", w, onehot)


def knn_probabilities(queries, keys, key_labels, valid, k: int, num_classes: int, bandwidth: float):
    """p_kNN [Q, C] of queries [Q, d] against a memory (keys [K, d], key_labels [K], valid [K]).

    Examples:
        >>> import numpy as np
        >>> keys, labels = jnp.array([[0.0], [0.1], [5.0]]), jnp.array([0, 0, 1])
        >>> p = knn_probabilities(jnp.array([[0.0]]), keys, labels, jnp.array([True, True, True]), k=3, num_classes=2,
        ...                       bandwidth=1.0)
        >>> print(np.asarray(p).round(3))
        [[1. 0.]]
    """
    dist, index = nearest_neighbours(queries, keys, valid, k)
    return label_distribution(dist, key_labels[index], num_classes, bandwidth)


def mix_log_probabilities(knn_probs, model_logits, weight: float):
    """log(weight * p_kNN + (1 - weight) * softmax(model_logits)), [Q, C], computed in log space
    so that weight 0 gives exactly log_softmax(model_logits) and weight 1 log p_kNN.

    Examples:
        >>> import numpy as np
        >>> knn = jnp.array([[1.0, 0.0]])
        >>> logits = jnp.array([[0.0, 0.0]])  # the model says 50/50
        >>> print(np.exp(np.asarray(mix_log_probabilities(knn, logits, 0.5))).round(3))
        [[0.75 0.25]]
    """
    log_model = jax.nn.log_softmax(model_logits.astype(jnp.float32), axis=-1)
    log_knn = jnp.log(knn_probs.astype(jnp.float32))
    log_w = jnp.log(jnp.float32(weight)) if weight > 0 else -jnp.inf
    log_1mw = jnp.log1p(-jnp.float32(weight)) if weight < 1 else -jnp.inf
    return jnp.logaddexp(log_w + log_knn, log_1mw + log_model)


def mix_logits(knn_probs, model_logits, weight: float):
    """weight * p_kNN + (1 - weight) * model_logits: what the authors' released evaluation
    script computes (its ``--interpolate_logits`` option defaults to a truthy string).

    Examples:
        >>> mix_logits(jnp.array([[1.0, 0.0]]), jnp.array([[2.0, 4.0]]), 0.5).tolist()
        [[1.5, 2.0]]
    """
    return weight * knn_probs + (1.0 - weight) * model_logits.astype(jnp.float32)
