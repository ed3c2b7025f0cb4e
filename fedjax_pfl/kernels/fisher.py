"""Diagonal Fisher information traces (FedAS), as pure jit-able functions.

A model enters as ``logits_fn(params, x) -> logits [B, C]`` (close over
everything that is not differentiated, e.g. BatchNorm statistics; FedAS
evaluates the trace in inference mode, as the authors' ``model.eval()``).
A batch enters as ``x [B, ...]``, ``y [B]`` int labels and ``mask [B]`` (False
for padding); a caller sums the terms over a client's batches (FedAS: its
train batches in order). Nothing here knows about clients or the engine.

Two forms of tr(F) with F the empirical Fisher of the NLL at the true labels:

* batch form (the FedAS authors' code, the default in FedAS):
  ``sum_t || grad_theta mean_{i in batch t} NLL_i ||^2`` -- squared gradients of
  the batch-mean NLL, summed over all parameters and over batches, NOT divided
  by the number of batches. A batch with no real sample contributes 0.
* per-sample form (the textbook empirical Fisher trace):
  ``mean_{real i} || grad_theta NLL_i ||^2``, with per-sample gradients from
  ``jax.vmap`` over the samples of a batch (never a Python loop).

The two differ by design: the batch form squares a mean (cross terms between
samples of a batch enter, and it grows with the number of batches), the
per-sample form averages squares.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_pfl.core import tree_ops
from fedjax_pfl.kernels import batch_losses, weighted_average

LogitsFn = Callable[..., jax.Array]
"""``logits_fn(params, x [B, ...]) -> logits [B, C]``."""

FORMS = ("batch", "per_sample")


def batch_gradient_sq_norm(logits_fn: LogitsFn, params, x, y, mask=None):
    """||grad_params of the masked batch-mean NLL||^2, summed over all parameters.

    One term of the batch-form trace. A batch without real samples gives 0.

    Examples:
        >>> def logits_fn(params, x):  # a linear model: logits = x @ w
        ...     return x @ params["w"]
        >>> params = {"w": jnp.zeros((2, 2))}
        >>> x, y = jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([0, 1])
        >>> round(float(batch_gradient_sq_norm(logits_fn, params, x, y)), 4)
        0.25
    """

    def loss(p):
        return batch_losses.cross_entropy(logits_fn(p, x), y, mask)

    return tree_ops.squared_norm(jax.grad(loss)(params))


def per_sample_gradient_sq_norms(logits_fn: LogitsFn, params, x, y):
    """[B] squared norms of each sample's NLL gradient (vmap over samples).

    Every sample is run as a batch of one, so a model with batch-dependent
    behaviour must be in inference mode inside ``logits_fn``.

    Examples:
        >>> def logits_fn(params, x):
        ...     return x @ params["w"]
        >>> x, y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.array([0, 1])
        >>> per_sample_gradient_sq_norms(logits_fn, {"w": jnp.zeros((2, 2))}, x, y).tolist()
        [0.5, 2.0]
    """

    def one(xi, yi):
        def loss(p):
            return batch_losses.cross_entropy(logits_fn(p, xi[None]), yi[None])

        return tree_ops.squared_norm(jax.grad(loss)(params))

    return jax.vmap(one)(x, y)


def per_sample_gradient_sq_norm_sum(logits_fn: LogitsFn, params, x, y, mask):
    """Sum over the real samples of a batch of their squared gradient norms.

    Examples:
        >>> def logits_fn(params, x):
        ...     return x @ params["w"]
        >>> x, y = jnp.array([[1.0, 0.0], [0.0, 2.0]]), jnp.array([0, 1])
        >>> round(float(per_sample_gradient_sq_norm_sum(logits_fn, {"w": jnp.zeros((2, 2))}, x, y, jnp.array([1, 0]))), 4)
        0.5
    """
    sq = per_sample_gradient_sq_norms(logits_fn, params, x, y)
    return jnp.sum(jnp.where(jnp.asarray(mask, bool), sq, 0.0))


def fisher_weights(traces, uploaded):
    """FedAS: alpha_i = F_i / sum_{j uploaded} F_j. traces [S], uploaded [S] bool.

    Examples:
        >>> fisher_weights(jnp.array([1.0, 3.0, 4.0]), jnp.array([True, True, False])).tolist()  # client 2's upload lost
        [0.25, 0.75, 0.0]
    """
    return weighted_average.normalize_weights(jnp.where(uploaded, traces, 0.0))
