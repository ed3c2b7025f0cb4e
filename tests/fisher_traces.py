"""A client's Fisher traces composed from the library's per-batch terms (kernels/fisher.py), for tests.

The library computes FedAS's traces batch by batch inside its training loop
(methods/fedas.py `fisher_trace`); these are the tests' own whole-client
forms to hold that against: the client's padded arrays cut into batches in
order (`as_batches`), each batch's term summed with ``lax.map``.
"""

import math

import jax
import jax.numpy as jnp

from fedjax_pfl.kernels import fisher


def as_batches(x, y, n, batch_size: int):
    """One client's padded arrays (x [n_max, ...], y [n_max], n real) -> (x [T, B, ...], y [T, B], mask [T, B])
    with T = ceil(n_max / B), in order; the last batch may be partial (a DataLoader without drop_last)."""
    n_max = y.shape[0]
    t = max(1, math.ceil(n_max / batch_size))
    pad = t * batch_size - n_max
    xp = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    yp = jnp.pad(y, (0, pad))
    mask = jnp.arange(t * batch_size) < n
    return xp.reshape((t, batch_size) + x.shape[1:]), yp.reshape(t, batch_size), mask.reshape(t, batch_size)


def trace_batch(logits_fn, params, x, y, mask):
    """Batch form (the FedAS authors' code): sum over batches t of ||grad mean-NLL_t||^2; x [T, B, ...]."""
    return jnp.sum(jax.lax.map(lambda b: fisher.batch_gradient_sq_norm(logits_fn, params, *b), (x, y, mask)))


def trace_per_sample(logits_fn, params, x, y, mask):
    """Per-sample form: mean over the real samples of ||grad NLL_i||^2 (0 without a real sample); x [T, B, ...]."""
    sums = jax.lax.map(lambda b: fisher.per_sample_gradient_sq_norm_sum(logits_fn, params, *b), (x, y, mask))
    return jnp.sum(sums) / jnp.maximum(jnp.sum(jnp.asarray(mask, jnp.float32)), 1.0)


TRACES = {"batch": trace_batch, "per_sample": trace_per_sample}  # by the names of fisher.FORMS
