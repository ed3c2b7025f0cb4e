"""Weighted averages over stacked client trees (leading axis S = uploading clients).

Weights are non-negative [S]; a zero weight excludes an upload (a dropped
straggler). `softmax_weights` turns per-candidate losses into such weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def normalize_weights(weights):
    """weights [S] -> weights / sum (all zeros stays all zeros).

    Examples:
        >>> normalize_weights(jnp.array([1.0, 3.0])).tolist(), normalize_weights(jnp.zeros(2)).tolist()
        ([0.25, 0.75], [0.0, 0.0])
    """
    w = jnp.asarray(weights, jnp.float32)
    return w / jnp.maximum(jnp.sum(w), 1e-30)


def weighted_mean(stacked, weights):
    """sum_i w_i tree_i / sum_i w_i over the leading axis of every leaf.

    Examples:
        >>> stacked = {"w": jnp.array([[0.0, 2.0], [4.0, 6.0]])}  # S=2 uploads
        >>> weighted_mean(stacked, jnp.array([3.0, 1.0]))["w"].tolist()  # n_i weights
        [1.0, 3.0]
    """
    w = normalize_weights(weights)
    return jax.tree.map(lambda a: jnp.tensordot(w, a.astype(jnp.float32), axes=1).astype(a.dtype), stacked)


def weighted_mean_or(stacked, weights, fallback):
    """`weighted_mean`, or ``fallback`` when every weight is zero (nobody uploaded).

    Examples:
        >>> stacked, fallback = {"w": jnp.array([[0.0], [4.0]])}, {"w": jnp.array([9.0])}
        >>> weighted_mean_or(stacked, jnp.array([1.0, 1.0]), fallback)["w"].tolist()
        [2.0]
        >>> weighted_mean_or(stacked, jnp.zeros(2), fallback)["w"].tolist()  # nobody uploaded
        [9.0]
    """
    mean = weighted_mean(stacked, weights)
    any_upload = jnp.sum(weights) > 0
    return jax.tree.map(lambda m, f: jnp.where(any_upload, m, f), mean, fallback)


def softmax_weights(losses, mask=None, temperature: float = 1.0):
    """Row-wise softmax of -losses / T: losses [S, M] -> weights [S, M] (rows sum to 1).

    ``mask`` [M] excludes columns (e.g. clients that did not upload).

    Examples:
        >>> import numpy as np
        >>> losses = jnp.array([[0.0, 1.0, 0.5]])  # S=1 row over M=3 candidates
        >>> print(np.asarray(softmax_weights(losses)).round(3))
        [[0.506 0.186 0.307]]
        >>> print(np.asarray(softmax_weights(losses, mask=jnp.array([True, True, False]))).round(3))
        [[0.731 0.269 0.   ]]
    """
    logits = -jnp.asarray(losses, jnp.float32) / temperature
    if mask is not None:
        logits = jnp.where(mask[None, :], logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1)
