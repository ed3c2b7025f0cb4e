"""Diagonal Fisher information traces (FedAS), as pure jit-able functions.

A model enters as ``logits_fn(params, x) -> logits [B, C]`` (close over
everything that is not differentiated, e.g. BatchNorm statistics; FedAS
evaluates the trace in inference mode, as the authors' ``model.eval()``).
Data enter as stacked batches: ``x [T, B, ...]``, ``y [T, B]`` int labels,
``mask [T, B]`` (False for padding). `as_batches` builds them from one
client's padded arrays. Nothing here knows about clients or the engine.

Two forms of tr(F) with F the empirical Fisher of the NLL at the true labels:

* batch form (the FedAS authors' code, the default in FedAS):
  ``sum_t || grad_theta mean_{i in batch t} NLL_i ||^2`` -- squared gradients of
  the batch-mean NLL, summed over all parameters and over batches, NOT divided
  by the number of batches. A batch with no real sample contributes 0.
* per-sample form (the textbook empirical Fisher trace):
  ``mean_{real i} || grad_theta NLL_i ||^2``, with per-sample gradients from
  ``jax.vmap`` over the samples of a batch (never a Python loop), batches
  traversed with ``lax.map``.

The two differ by design: the batch form squares a mean (cross terms between
samples of a batch enter, and it grows with the number of batches), the
per-sample form averages squares.
"""

from __future__ import annotations

import math
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


def fisher_trace_batch(logits_fn: LogitsFn, params, x, y, mask):
    """Batch-form trace (authors' code): sum over batches t of ||grad mean-NLL_t||^2.

    x [T, B, ...], y [T, B], mask [T, B]. Batches are traversed with ``lax.map``.

    Examples:
        >>> def logits_fn(params, x):
        ...     return x @ params["w"]
        >>> x, y, mask = as_batches(jnp.eye(3, 2), jnp.array([0, 1, 0]), n=2, batch_size=2)  # T=2 batches
        >>> round(float(fisher_trace_batch(logits_fn, {"w": jnp.zeros((2, 2))}, x, y, mask)), 4)
        0.25
    """
    per_batch = jax.lax.map(lambda b: batch_gradient_sq_norm(logits_fn, params, *b), (x, y, mask))
    return jnp.sum(per_batch)


def fisher_trace_per_sample(logits_fn: LogitsFn, params, x, y, mask):
    """Per-sample empirical Fisher trace: mean over real samples of ||grad NLL_i||^2.

    x [T, B, ...], y [T, B], mask [T, B]. 0 when there is no real sample.

    Examples:
        >>> def logits_fn(params, x):
        ...     return x @ params["w"]
        >>> x, y, mask = as_batches(jnp.eye(3, 2), jnp.array([0, 1, 0]), n=2, batch_size=2)
        >>> round(float(fisher_trace_per_sample(logits_fn, {"w": jnp.zeros((2, 2))}, x, y, mask)), 4)
        0.5
    """
    sums = jax.lax.map(lambda b: per_sample_gradient_sq_norm_sum(logits_fn, params, *b), (x, y, mask))
    count = jnp.sum(jnp.asarray(mask, jnp.float32))
    return jnp.sum(sums) / jnp.maximum(count, 1.0)


def fisher_trace(logits_fn: LogitsFn, params, x, y, mask, form: str = "batch"):
    """`fisher_trace_batch` or `fisher_trace_per_sample` by name (``form`` is static).

    Examples:
        >>> def logits_fn(params, x):
        ...     return x @ params["w"]
        >>> x, y, mask = as_batches(jnp.eye(3, 2), jnp.array([0, 1, 0]), n=2, batch_size=2)
        >>> [round(float(fisher_trace(logits_fn, {"w": jnp.zeros((2, 2))}, x, y, mask, form)), 4) for form in FORMS]
        [0.25, 0.5]
    """
    if form == "batch":
        return fisher_trace_batch(logits_fn, params, x, y, mask)
    if form == "per_sample":
        return fisher_trace_per_sample(logits_fn, params, x, y, mask)
    raise ValueError(f"Fisher form must be one of {FORMS}, got {form!r}")


def as_batches(x, y, n, batch_size: int):
    """One client's padded arrays (x [n_max, ...], y [n_max], n real) -> batches in order.

    Returns (x [T, B, ...], y [T, B], mask [T, B]) with T = ceil(n_max / B);
    the last batch may be partial, as a DataLoader without drop_last.

    Examples:
        >>> x, y, mask = as_batches(jnp.zeros((5, 3)), jnp.arange(5), n=3, batch_size=2)
        >>> x.shape, y.tolist(), mask.tolist()
        ((3, 2, 3), [[0, 1], [2, 3], [4, 0]], [[True, True], [True, False], [False, False]])
    """
    n_max = y.shape[0]
    t = max(1, math.ceil(n_max / batch_size))
    pad = t * batch_size - n_max
    xp = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    yp = jnp.pad(y, (0, pad))
    mask = jnp.arange(t * batch_size) < n
    return (xp.reshape((t, batch_size) + x.shape[1:]), yp.reshape(t, batch_size),
            mask.reshape(t, batch_size))


def fisher_weights(traces, uploaded):
    """FedAS: alpha_i = F_i / sum_{j uploaded} F_j. traces [S], uploaded [S] bool.

    Examples:
        >>> fisher_weights(jnp.array([1.0, 3.0, 4.0]), jnp.array([True, True, False])).tolist()  # client 2's upload lost
        [0.25, 0.75, 0.0]
    """
    return weighted_average.normalize_weights(jnp.where(uploaded, traces, 0.0))
