"""Plain per-client Python loops for the engine-equality tests of FedFomo, APPLE and pFedHN.

They share only the documented key contracts with the library: how a round
key is split (selection, stragglers, clients), how local training derives its
per-epoch shuffles (`local_training.epoch_order`) and how step-counted methods
draw their random batches (`pfedkd.random_batch_index`). Training runs over
real samples only (no padding, no masks), one jitted gradient per batch.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl import engine as engine_lib
from fedjax_pfl import local_training
from fedjax_pfl.methods.pfedkd import random_batch_index

SIZES = [7, 23, 1, 16, 12]
B, E, S = 5, 2, 3


def client_arrays(input_shape, classes=4, seed=0):
    """(x list, y list) of the clients in SIZES, uint8 images and int labels."""
    rng = np.random.default_rng(seed)
    xs = [rng.integers(0, 256, size=(n, *input_shape), dtype=np.uint8) for n in SIZES]
    ys = [rng.integers(0, classes, size=n).astype(np.int32) for n in SIZES]
    return xs, ys


def stacked(xs, ys):
    from fedjax_pfl.data.client_data import stack_clients
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    idx, start = [], 0
    for a in xs:
        idx.append(np.arange(start, start + len(a)))
        start += len(a)
    return stack_clients(x, y, idx)


def normalize(x):
    return jnp.asarray(x).astype(jnp.float32) / 255.0 - 0.5


def round_keys(key, t):
    """(selected client indices, per-client keys) of round t, as the engine derives them."""
    k_sel, _, k_clients = jax.random.split(jax.random.fold_in(key, t), 3)
    selected = np.asarray(engine_lib.select_clients(k_sel, len(SIZES), S))
    return selected, jax.random.split(k_clients, S)


@functools.lru_cache(maxsize=None)
def _jitted_grad(loss_fn):
    return jax.jit(jax.grad(loss_fn))


def train_epochs(loss_fn, optimizer, params, x, y, key, epochs=E, n_max=None, extra=()):
    """E epochs of minibatch steps over the n real samples, in the library's shuffle order.

    ``loss_fn(params, x_batch, y_batch, *extra)``; its jitted gradient is cached per function.
    """
    n = x.shape[0]
    n_max = max(SIZES) if n_max is None else n_max
    sched_key, _ = jax.random.split(key)
    epoch_keys = jax.random.split(sched_key, epochs)
    grad = lambda p, xb, yb: _jitted_grad(loss_fn)(p, xb, yb, *extra)
    state = optimizer.init(params)
    for e in range(epochs):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, n_max))[:n]
        for s in range(math.ceil(n / B)):
            b = order[s * B:(s + 1) * B]
            updates, state = optimizer.update(grad(params, normalize(x[b]), jnp.asarray(y[b])), state, params)
            params = optax.apply_updates(params, updates)
    return params


def train_random_batches(loss_fn, optimizer, params, x, y, key, steps, n_max=None, extra=()):
    """``steps`` steps, each on B distinct random samples (the step-counted methods' contract)."""
    n = x.shape[0]
    n_max = max(SIZES) if n_max is None else n_max
    grad = lambda p, xb, yb: _jitted_grad(loss_fn)(p, xb, yb, *extra)
    state = optimizer.init(params)
    for k in jax.random.split(key, steps):
        _, k_batch = jax.random.split(k)
        index, mask = random_batch_index(k_batch, n, n_max, B)
        b = np.asarray(index)[np.asarray(mask)]
        updates, state = optimizer.update(grad(params, normalize(x[b]), jnp.asarray(y[b])), state, params)
        params = optax.apply_updates(params, updates)
    return params


def assert_close(a, b, tol=1e-5):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=tol, atol=tol)
