"""The small federation of the Ditto, APFL, FedAMP and FedProto tests, and its per-client reference loop.

Five ragged clients (SIZES; a one-sample client; few distinct batch shapes,
so fewer compiles) of uniform random 6x6 images over C classes, an MLP of 8
hidden units, SGD with momentum 0.9 at LR, B=5, E=2, S=3 clients a round.
The per-client references share only the documented key contract with the
engine (round key -> selection / straggler / client keys; each client's
per-epoch shuffle, `local_training.epoch_order`); they train with an
unpadded Python loop over real batches and aggregate in float64 NumPy.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from uniform_clients import normalize, uniform_clients
from fedjax_pfl import losses
from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods.base import ClientRound
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

SIZES = [7, 15, 1, 10, 12]  # ragged, a one-sample client; few distinct batch shapes (fewer compiles)
N, B, E, S, C, LR = len(SIZES), 5, 2, 3, 4, 0.1
N_MAX = max(SIZES)

MODEL = build_model("mlp", (6, 6, 1), C, hidden=(8,))


def model():
    return MODEL


def setup(optimizer=functools.partial(optax.sgd, momentum=0.9), epochs=E):
    """``optimizer``: learning rate -> the local optimizer (run at LR)."""
    return local_setup(model=MODEL, optimizer=optimizer, lr=LR, batch_size=B, local_epochs=epochs,
                       normalize=normalize)


def raw_data(seed=0):
    return uniform_clients(SIZES, (6, 6, 1), C, seed)


def client_data(c):
    x, y, idx = raw_data()
    return ClientData(*jax.tree.map(lambda a: a[c], tuple(stack_clients(x, y, idx))))


def assert_close(a, b, tol=1e-5):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=tol, atol=tol)


def batches(key, n, epochs):
    """The real batches of one client, in the engine's documented order."""
    sched_key, _ = jax.random.split(key)
    epoch_keys = jax.random.split(sched_key, E)
    for e in range(epochs):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, N_MAX))[:n]
        for s in range(math.ceil(n / B)):
            yield e, s, order[s * B:(s + 1) * B]


def logits(params, x):
    return model().apply({"params": params}, normalize(x), train=False).logits


def features(params, x):
    return model().apply({"params": params}, normalize(x), train=False).features


def ce(params, x, y):
    return losses.cross_entropy(logits(params, x), jnp.asarray(y))


@functools.lru_cache(maxsize=None)
def jit_grad(loss_fn, argnums=0):
    return jax.jit(jax.grad(loss_fn, argnums=argnums))


def ref_sgd(loss_fn, params, x, y, key, *extra):
    """Per-client loop over real batches: SGD momentum 0.9 on loss_fn(params, xb, yb, *extra)."""
    opt = optax.sgd(LR, momentum=0.9)
    state = opt.init(params)
    grad = jit_grad(loss_fn)
    for _, _, b in batches(key, x.shape[0], E):
        updates, state = opt.update(grad(params, x[b], y[b], *extra), state, params)
        params = optax.apply_updates(params, updates)
    return params


def prox_loss(p, xb, yb, anchor, weight):
    return ce(p, xb, yb) + weight * 0.5 * tree_ops.squared_norm(tree_ops.sub(p, anchor))


def weighted_mean64(trees, weights):
    w = np.asarray(weights, np.float64) / np.sum(weights)
    return jax.tree.map(lambda *a: sum(wi * np.asarray(ai, np.float64) for wi, ai in zip(w, a)), *trees)


def round_plan(key, t):
    k_sel, _, k_clients = jax.random.split(jax.random.fold_in(key, t), 3)
    return np.asarray(engine_lib.select_clients(k_sel, N, S)), jax.random.split(k_clients, S)


def run_engine(method, mapping, rounds, key):
    x, y, idx = raw_data()
    train = stack_clients(x, y, idx)
    eng = engine_lib.Engine(method, train, train, engine_config(S, client_mapping=mapping))
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    for t in range(rounds):
        server, clients, _ = eng.round(server, clients, jax.random.fold_in(key, t), t)
    return eng, server, clients


def one_client(method, client, c=1, key=jax.random.key(9), server=None):
    info = ClientRound(jnp.int32(0), jnp.int32(E))
    return jax.jit(method.client_update)(server, client, client_data(c), key, info)
