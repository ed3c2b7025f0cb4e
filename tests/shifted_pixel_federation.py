"""The small federation of the kNN-Per, FedCAC and GPFL tests, and its per-client momentum-SGD loop.

Five ragged clients (SIZES, padded to 20; batch shapes 5 and 2 only, so few
reference compiles) of 6x6 images whose pixels shift with the label, an MLP
of 8 hidden units, SGD with momentum 0.9 at LR. The references share only the
documented key contract with the engine (round key -> selection / straggler /
client keys; each client's per-epoch shuffling of its own samples) and the
initial state; training is an unpadded loop over real batches, server rules
are float64 NumPy loops, losses are written out in the tests again.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from uniform_clients import normalize
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

SIZES = [7, 20, 2, 15, 10]  # ragged, padded to 20; batch shapes 5 and 2 only (few reference compiles)
B, E, S, C = 5, 2, 3, 4
LR = 0.1


def data(seed=0):
    rng = np.random.default_rng(seed)
    total = sum(SIZES)
    y = rng.integers(0, C, size=total).astype(np.int32)
    x = np.clip(rng.normal(size=(total, 6, 6, 1)) * 40 + 128 + 30 * y[:, None, None, None], 0, 255).astype(np.uint8)
    bounds = np.cumsum([0] + SIZES)
    return x, y, [np.arange(bounds[i], bounds[i + 1]) for i in range(len(SIZES))]


def model():
    return build_model("mlp", (6, 6, 1), C, hidden=(8,))


def method(name, options=None):
    setup = local_setup(model=model(), optimizer=functools.partial(optax.sgd, momentum=0.9), lr=LR, batch_size=B,
                        local_epochs=E, normalize=normalize)
    cls = get_method(name)
    return cls(setup, cls.hparams_type(**(options or {})) if cls.hparams_type else None)


def engine(name, options=None, mapping="vmap", test_seed=0):
    m = method(name, options)
    x, y, idx = data()
    xt, yt, idxt = data(test_seed)
    cfg = engine_config(S, client_mapping=mapping, chunk_size=2)
    return engine_lib.Engine(m, stack_clients(x, y, idx), stack_clients(xt, yt, idxt), cfg)


def run(eng, rounds, key, metrics=None):
    """``rounds`` engine rounds -> (initial state, server, clients, key); each round's metrics appended to
    ``metrics`` when given."""
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    initial = jax.tree.map(np.asarray, (server, clients))
    for t in range(rounds):
        server, clients, m = eng.round(server, clients, jax.random.fold_in(key, t), t)
        if metrics is not None:
            metrics.append(m)
    return initial, server, clients, key


def fedavg_run():
    """Two FedAvg rounds (test clients of seed 1) -> (engine, server, clients, key)."""
    eng = engine("fedavg", test_seed=1)
    _, server, clients, key = run(eng, 2, jax.random.key(4))
    return eng, server, clients, key


def plan(key, t):
    k_sel, _, k_clients = jax.random.split(jax.random.fold_in(key, t), 3)
    return np.asarray(engine_lib.select_clients(k_sel, len(SIZES), S)), jax.random.split(k_clients, S)


@functools.lru_cache(maxsize=None)
def _step(loss_fn, plain=(), decay=0.0):
    """One jit-compiled step of ``loss_fn(params, x, y, *extra)``: SGD with momentum 0.9 (v = 0.9 v + g,
    p -= LR v); the top-level keys in ``plain`` take plain SGD with weight decay, p -= LR (g + decay p)
    (GPFL's valve and embeddings)."""

    @jax.jit
    def step(params, velocity, xb, yb, *extra):
        grads = jax.grad(loss_fn)(params, normalize(xb), yb, *extra)
        velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
        direction = {k: jax.tree.map(lambda g, p: g + decay * p, grads[k], params[k]) if k in plain
                     else velocity[k] for k in params}
        return jax.tree.map(lambda p, d: p - LR * d, params, direction), velocity

    return step


def train(loss_fn, params, x, y, key, *extra, plain=(), decay=0.0, step_losses=None):
    """Per-client local training over real batches in the client's own epoch order. ``decay``: weight decay
    of the ``plain`` keys (decay * p added to their gradient, as PyTorch's SGD weight_decay);
    ``step_losses``: a list that gets ``loss_fn`` before each step."""
    step = _step(loss_fn, plain, decay)
    state = jax.tree.map(jnp.zeros_like, params)
    n = x.shape[0]
    epoch_keys = jax.random.split(jax.random.split(key)[0], E)
    for e in range(E):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, max(SIZES)))[:n]
        for s in range(math.ceil(n / B)):
            b = order[s * B:(s + 1) * B]
            if step_losses is not None:
                step_losses.append(float(loss_fn(params, normalize(x[b]), y[b], *extra)))
            params, state = step(params, state, x[b], y[b], *extra)
    return params


def nll(logits, y):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def mean64(rows, weights):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return jax.tree.map(lambda *a: sum(wi * np.asarray(ai, np.float64) for wi, ai in zip(w, a)), *rows)


def close(a, b, tol=1e-5):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=tol, atol=tol)


def row(tree, i):
    return jax.tree.map(lambda a: a[i], tree)
