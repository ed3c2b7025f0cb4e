"""Plain per-client Python loops for the engine-equality tests of FedFomo, APPLE and pFedHN,
and the small real-data runs of the learning tests.

They share only the documented key contracts with the library: how a round
key is split (selection, stragglers, clients), how local training derives its
per-epoch shuffles (`local_training.epoch_order`) and how step-counted methods
draw their random batches (`step_counted.random_batch_index`). Training runs over
real samples only (no padding, no masks), one jitted gradient per batch.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import local_training
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.step_counted import random_batch_index

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
    k_sel, _, k_clients = jax.random.split(engine_lib.round_keys(key, t)[0], 3)
    selected = np.asarray(engine_lib.select_clients(k_sel, len(SIZES), S))
    return selected, jax.random.split(k_clients, S)


@functools.lru_cache(maxsize=None)
def _jitted_step(loss_fn, optimizer, gradient=False):
    """One jitted optimizer step on ``loss_fn(params, x_batch, y_batch, *extra)``, cached per pair
    (``gradient``: ``loss_fn`` returns the gradient itself)."""
    grad_fn = loss_fn if gradient else jax.grad(loss_fn)

    @jax.jit
    def step(params, state, xb, yb, *extra):
        updates, state = optimizer.update(grad_fn(params, xb, yb, *extra), state, params)
        return optax.apply_updates(params, updates), state

    return step


def train_epochs(loss_fn, optimizer, params, x, y, key, epochs=E, n_max=None, extra=(), gradient=False):
    """E epochs of minibatch steps over the n real samples, in the library's shuffle order.

    ``loss_fn(params, x_batch, y_batch, *extra)`` (``gradient``: a function of the same arguments that
    returns the gradient); pass the same ``loss_fn`` and ``optimizer`` objects across calls so that
    their jitted step is compiled once.
    """
    n = x.shape[0]
    n_max = max(SIZES) if n_max is None else n_max
    sched_key, _ = jax.random.split(key)
    epoch_keys = jax.random.split(sched_key, epochs)
    step = _jitted_step(loss_fn, optimizer, gradient)
    state = optimizer.init(params)
    for e in range(epochs):
        order = np.asarray(local_training.epoch_order(epoch_keys[e], n, n_max))[:n]
        for s in range(math.ceil(n / B)):
            b = order[s * B:(s + 1) * B]
            params, state = step(params, state, normalize(x[b]), jnp.asarray(y[b]), *extra)
    return params


def train_random_batches(loss_fn, optimizer, params, x, y, key, steps, n_max=None, extra=()):
    """``steps`` steps, each on B distinct random samples (the step-counted methods' contract)."""
    n = x.shape[0]
    n_max = max(SIZES) if n_max is None else n_max
    step = _jitted_step(loss_fn, optimizer)
    state = optimizer.init(params)
    for k in jax.random.split(key, steps):
        _, k_batch = jax.random.split(k)
        index, mask = random_batch_index(k_batch, n, n_max, B)
        b = np.asarray(index)[np.asarray(mask)]
        params, state = step(params, state, normalize(x[b]), jnp.asarray(y[b]), *extra)
    return params


def assert_close(a, b, tol=1e-5):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=tol, atol=tol)


def fmnist_engine(data_dir, method_name, extra=()):
    """The engine of a small FMNIST pathological run (6 clients, 2 classes, 100/50 samples, MLP 32, Adam)."""
    from fedjax_pfl.runs import config as config_lib
    from fedjax_pfl.runs.experiment import build_experiment, validate

    overrides = ["data.name=fmnist", f"data.data_dir={data_dir}", "partition.scheme=pathological",
                 "partition.num_clients=6", "partition.classes_per_client=2", "partition.train_per_client=100",
                 "partition.test_per_client=50", "partition.test_from=split", "model.name=mlp", "model.hidden=[32]",
                 "train.optimizer=adam", "train.lr=0.003", "train.batch_size=25", "train.local_epochs=2",
                 "train.join_ratio=1.0", f"method_name={method_name}", *extra]
    return build_experiment(validate(config_lib.build(None, overrides))).engine


def run_engine(eng, rounds):
    """``rounds`` rounds from a fresh init (key 0) -> (accuracy before training, summary after,
    last round's metrics, server, clients)."""
    init_key, key = jax.random.split(jax.random.key(0))
    server, clients = eng.init(init_key)
    first = eng.evaluate_summary(server, clients, key)["accuracy"]
    server, clients, metrics = eng.run(server, clients, key, rounds)
    return first, eng.evaluate_summary(server, clients, key), metrics, server, clients


def accuracy_of(method_name, eng, rounds):
    """Accuracy of ``method_name`` after ``rounds`` rounds on ``eng``'s clients, setup and engine
    config: the FedAvg or Local bar that a personalized method's paper claims to clear."""
    other = engine_lib.Engine(get_method(method_name)(eng.method.setup), eng.train, eng.test, eng.config)
    return run_engine(other, rounds)[1]["accuracy"]


def fmnist_run(data_dir, method_name, rounds, extra=()):
    """`run_engine` of `fmnist_engine`."""
    return run_engine(fmnist_engine(data_dir, method_name, extra), rounds)


@functools.lru_cache(maxsize=None)
def fmnist_fedavg_accuracy(data_dir, rounds):
    """FedAvg's accuracy after ``rounds`` rounds on `fmnist_engine`'s partition (once per process)."""
    return accuracy_of("fedavg", fmnist_engine(data_dir, "fedavg"), rounds)
