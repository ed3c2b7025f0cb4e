"""The small federation of the tests of six baselines as their authors ran them, and its float64
linear-model reference.

Five ragged clients (SIZES) of uniform random 4x4 images over C=3 classes,
plain SGD (lr 0.1, B=5, 2 epochs) on an MLP of 6 hidden units or any model
the test names; `steps_heard` lists the local steps a call takes, and the
float64 functions below follow a linear model (``mlr``) over the random
batches the step-counted methods draw.
"""

import jax
import numpy as np
import optax

from uniform_clients import normalize, uniform_clients
from fedjax_pfl.core import tree_ops
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.kernels.counted_loop import Loops
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.step_counted import random_batch_index
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.runs import config as config_lib
from settings_records import local_setup

SIZES = [7, 23, 13, 16, 12]
C, B = 3, 5
SHAPE = (4, 4, 1)


def train_data(seed=0):
    return stack_clients(*uniform_clients(SIZES, SHAPE, C, seed))


def client_data(c=2):
    return ClientData(*tree_ops.gather(tuple(train_data()), c))


def setup(model_name="mlp", epochs=2, lr=0.1, shape=SHAPE, batch_size=B):
    kwargs = {"hidden": (6,)} if model_name == "mlp" else {}
    return local_setup(model=build_model(model_name, shape, C, **kwargs), optimizer=optax.sgd, lr=lr,
                       batch_size=batch_size, local_epochs=epochs, normalize=normalize)


def method(name, local_setup=None, **options):
    cls = get_method(name)
    return cls(local_setup or setup(), config_lib.method_options(cls.hparams_type, options))


def host(tree):
    return jax.tree.map(np.array, tree)


def steps_heard(method, name, *args):
    """(done, total) of every local step ``method``'s function ``name`` takes on ``args``, in order (its
    counted loops' reporter, kernels/counted_loop.py `Loops`)."""
    heard = []

    def report(kind, done, total, value):
        jax.debug.callback(lambda d, t: heard.append((int(d), int(t))), done, total, ordered=True)

    out = jax.jit(getattr(method.with_loops(Loops(report=report)), name))(*args)
    jax.effects_barrier()
    return out, heard


def softmax_ce_grad64(w, b, x, y):
    """Gradient (dW, db) of the mean cross-entropy of the linear model x @ w + b, float64."""
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return x.T @ p, p.sum(0)


def batches64(data, keys):
    """The float64 (x, y) of the random batches `random_batch_index` draws from ``keys`` (all rows real here)."""
    out = []
    for k in keys:
        index, mask = random_batch_index(k, data.n, data.y.shape[0], B)
        assert bool(np.all(mask))
        index = np.asarray(index)
        x = np.asarray(data.x)[index].reshape(B, -1).astype(np.float64) / 255.0 - 0.5
        out.append((x, np.asarray(data.y)[index]))
    return out


def linear64(params):
    logits = params["head"]["logits"]
    return np.asarray(logits["kernel"], np.float64), np.asarray(logits["bias"], np.float64)
