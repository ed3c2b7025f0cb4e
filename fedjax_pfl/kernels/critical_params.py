"""FedCAC's kernels (Wu et al., ICCV 2023): critical-parameter masks, the
overlap of clients' critical sets, the collaboration threshold schedule, and
the customized global models.

Pure, jit-able functions; no loop over clients or pairs.

* `sensitivity`: |delta * theta| per parameter, delta = the local update
  theta_trained - theta_received (the authors' code, ``evaluate_critical_parameter``:
  the accumulated update stands for the gradient of the paper's |g * theta|).
* `critical_mask`: per parameter tensor, the ``ratio`` (tau) fraction with the
  largest sensitivity: threshold = the int(tau * size)-th largest value
  (ties included: mask = s >= threshold); a threshold <= 1e-10 is replaced by
  the smallest value > 1e-20 (if there is one), as in the authors' code; tau
  = 0 marks nothing.
* `overlap_rates`: o_ij = 1 - |c_i - c_j|_1 / (2 |c_i|_1) over all
  parameters, for binary masks c: from ONE Gram matmul of the flattened masks
  (|c_i - c_j|_1 = n_i + n_j - 2 c_i.c_j). Not symmetric when n_i != n_j.
* `collaboration_threshold`: mean + (t + 1) / beta * (max - mean) of the
  off-diagonal overlaps among active clients (those with a mask), t = the
  round just trained: "bold" early (the mean), "cautious" late (the max).
* `collaboration_weights`: client i averages its own model and those of the
  active clients j != i with o_ij >= threshold, unweighted (row-normalised 0/1).
* `customized_models`: weights @ models (model_distance.apply_mixing: one matmul).
* `merge`: critical parameters from the customized model, the rest from the global one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels.model_distance import apply_mixing

_HIGHEST = jax.lax.Precision.HIGHEST


def sensitivity(trained, received):
    """|(trained - received) * trained| per parameter (trees of the same structure).

    Examples:
        >>> sensitivity({"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([0.5, 2.0])})["w"].tolist()
        [0.5, 0.0]
    """
    return jax.tree.map(lambda t, r: jnp.abs((t - r) * t), trained, received)


def gradient_sensitivity(params, grads):
    """|grad * theta| per parameter: the paper's first-order reading.

    Examples:
        >>> gradient_sensitivity({"w": jnp.array([1.0, -2.0])}, {"w": jnp.array([0.5, 0.5])})["w"].tolist()
        [0.5, 1.0]
    """
    return jax.tree.map(lambda p, g: jnp.abs(g * p), params, grads)


def critical_mask(values, ratio: float):
    """Bool mask of the ``ratio`` fraction of largest entries of one tensor (see module docstring).

    Examples:
        >>> critical_mask(jnp.array([0.1, 0.9, 0.5, 0.3]), ratio=0.5).tolist()
        [False, True, True, False]
    """
    flat = values.reshape(-1)
    count = int(ratio * flat.size)
    if count == 0:
        return jnp.zeros(values.shape, bool)
    threshold = jax.lax.top_k(flat, count)[0][-1]
    nonzero = flat > 1e-20
    smallest_nonzero = jnp.min(jnp.where(nonzero, flat, jnp.inf))
    threshold = jnp.where((threshold <= 1e-10) & jnp.any(nonzero), smallest_nonzero, threshold)
    return values >= threshold


def critical_masks(sensitivities, ratio: float):
    """`critical_mask` of every leaf (each parameter tensor on its own).

    Examples:
        >>> masks = critical_masks({"a": jnp.array([3.0, 1.0]), "b": jnp.array([1.0, 2.0, 3.0, 4.0])}, 0.5)
        >>> masks["a"].tolist(), masks["b"].tolist()
        ([True, False], [False, False, True, True])
    """
    return jax.tree.map(lambda s: critical_mask(s, ratio), sensitivities)


def overlap_rates(masks):
    """o [N, N] for N clients' masks ([N, P] or a stacked tree of bools); diagonal is 1.

    Examples:
        >>> import numpy as np
        >>> masks = jnp.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0]], bool)  # N=3 clients, P=4
        >>> print(np.asarray(overlap_rates(masks)).round(3))
        [[1.  0.5 1. ]
         [0.5 1.  0.5]
         [1.  0.5 1. ]]
    """
    c = masks if hasattr(masks, "ndim") else tree_ops.flatten_stacked(masks)
    c = c.astype(jnp.float32)
    n = jnp.sum(c, axis=1)
    shared = jnp.matmul(c, c.T, precision=_HIGHEST)
    differ = n[:, None] + n[None, :] - 2.0 * shared
    return 1.0 - differ / jnp.maximum(2.0 * n[:, None], 1.0)


def _pairs(active):
    n = active.shape[0]
    return active[:, None] & active[None, :] & ~jnp.eye(n, dtype=bool)


def collaboration_threshold(overlap, active, round_index, beta: float):
    """mean + (round + 1) / beta * (max - mean) over off-diagonal pairs of active clients.

    Examples:
        >>> overlap = jnp.array([[1.0, 0.5, 1.0], [0.5, 1.0, 0.5], [1.0, 0.5, 1.0]])
        >>> active = jnp.array([True, True, True])
        >>> round(float(collaboration_threshold(overlap, active, round_index=0, beta=2.0)), 4)  # mean 2/3 + (1/2)(1 - 2/3)
        0.8333
    """
    pairs = _pairs(active)
    count = jnp.sum(pairs)
    mean = jnp.sum(jnp.where(pairs, overlap, 0.0)) / jnp.maximum(count, 1)
    top = jnp.max(jnp.where(pairs, overlap, -jnp.inf))
    top = jnp.where(count > 0, top, mean)
    return mean + (round_index + 1.0) / beta * (top - mean)


def collaboration_weights(overlap, active, threshold):
    """W [N, N]: row i is uniform over {i} and the active j != i with o_ij >= threshold.

    Examples:
        >>> import numpy as np
        >>> overlap = jnp.array([[1.0, 0.5, 1.0], [0.5, 1.0, 0.5], [1.0, 0.5, 1.0]])
        >>> print(np.asarray(collaboration_weights(overlap, jnp.array([True, True, True]), 0.8)).round(3))
        [[0.5 0.  0.5]
         [0.  1.  0. ]
         [0.5 0.  0.5]]
    """
    n = overlap.shape[0]
    chosen = (_pairs(active) & (overlap >= threshold)) | jnp.eye(n, dtype=bool)
    chosen = chosen.astype(jnp.float32)
    return chosen / jnp.sum(chosen, axis=1, keepdims=True)


def customized_models(weights, models):
    """Row i: sum_j W_ij model_j. weights [S, N], models a stacked tree (or [N, P]) of N models.

    Examples:
        >>> weights = jnp.array([[0.5, 0.0, 0.5]])  # S=1 row over N=3 models
        >>> import numpy as np
        >>> print(np.asarray(customized_models(weights, jnp.array([[0.0, 2.0], [9.0, 9.0], [2.0, 4.0]]))).round(3))
        [[1. 3.]]
    """
    return apply_mixing(weights, models)


def merge(mask, customized, global_params):
    """Critical entries from ``customized``, the others from ``global_params`` (trees).

    Examples:
        >>> mask = {"w": jnp.array([True, False])}
        >>> merge(mask, {"w": jnp.array([1.0, 1.0])}, {"w": jnp.array([5.0, 5.0])})["w"].tolist()
        [1.0, 5.0]
    """
    return jax.tree.map(jnp.where, mask, customized, global_params)
