"""The small federation of the split-model tests (LG-FedAvg, FedBABU, FedRoD, FedALA, evaluation fine-tuning).

Five ragged clients (SIZES; one with a single sample) of uniform random 6x6
images over C classes, an MLP of 16 hidden units with a body and a head, SGD
with momentum 0.9 at lr 0.1, B=5, E=2, S=3 clients a round; each client's
test data is its train data.
"""

import functools

import jax
import numpy as np
import optax

from uniform_clients import normalize, uniform_clients
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

SIZES = [7, 23, 1, 16, 12]
C, B, E, S = 4, 5, 2, 3
SHAPE = (6, 6, 1)


def mlp():
    return build_model("mlp", SHAPE, C, hidden=(16,))


def setup(model):
    return local_setup(model=model, optimizer=functools.partial(optax.sgd, momentum=0.9), lr=0.1, batch_size=B,
                       local_epochs=E, normalize=normalize)


def raw(seed=0):
    return uniform_clients(SIZES, SHAPE, C, seed)


def engine(name, hparams=None, model=None):
    model = model or mlp()
    x, y, idx = raw()
    train = stack_clients(x, y, idx)
    method = get_method(name)(setup(model), hparams)
    return engine_lib.Engine(method, train, train, engine_config(S, client_mapping="vmap"))


def run(eng, rounds, key):
    init_key, key = jax.random.split(key)
    server, clients = eng.init(init_key)
    for t in range(rounds):
        server, clients, _ = eng.round(server, clients, jax.random.fold_in(key, t), t)
    return server, clients


def close(a, b, tol=1e-5):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=tol, atol=tol)


def host(tree):
    return jax.tree.map(np.array, tree)
