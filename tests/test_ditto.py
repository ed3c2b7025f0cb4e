"""Ditto: the engine against a per-client Python loop; lambda 0 is local training and a huge
lambda stays at the global model; option errors.

The federation and its reference loop: tests/personal_model_federation.py.
Learning on real Fashion-MNIST: tests/test_learning_fmnist_two_class.py.
"""

import jax
import numpy as np
import optax
import pytest

import personal_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.ditto import DittoConfig
from fedjax_pfl.runs import config as config_lib


def _sq_dist(a, b):
    return float(sum(np.sum((np.asarray(x, np.float64) - np.asarray(y, np.float64)) ** 2)
                     for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


def _ref_ditto(rounds, key, lamda):
    x, y, idx = fed.raw_data()
    init_key, key = jax.random.split(key)
    w = fed.model().init(init_key)["params"]
    personal = [w] * fed.N
    for t in range(rounds):
        selected, keys = fed.round_plan(key, t)
        trained = []
        for j, c in enumerate(selected):
            xc, yc = x[idx[c]], y[idx[c]]
            trained.append(fed.ref_sgd(fed.ce, w, xc, yc, keys[j]))
            personal[c] = fed.ref_sgd(fed.prox_loss, personal[c], xc, yc, keys[j], w, lamda)
        w = fed.weighted_mean64(trained, [fed.SIZES[c] for c in selected])
    return w, personal


def test_ditto_engine_equals_per_client_loop():
    key = jax.random.key(3)
    ref_w, ref_personal = _ref_ditto(2, key, lamda=0.5)
    _, server, clients = fed.run_engine(get_method("ditto")(fed.setup(), DittoConfig(lamda=0.5)), "vmap", 2, key)
    fed.assert_close(server["variables"]["params"], ref_w)
    for c in range(fed.N):
        fed.assert_close(tree_ops.gather(clients["variables"]["params"], c), ref_personal[c])


def test_ditto_lambda_zero_is_local_and_huge_lambda_stays_at_w():
    setup = fed.setup(optax.sgd)
    w = fed.model().init(jax.random.key(0))
    v0 = jax.tree.map(lambda a: a + 1.0, w)  # a personal model far from w
    server = {"variables": w}
    free, _ = fed.one_client(get_method("ditto")(setup, DittoConfig(lamda=0.0)), {"variables": v0}, server=server)
    local, _ = fed.one_client(get_method("local")(setup), {"variables": v0}, server={})
    fed.assert_close(free["variables"], local["variables"], tol=1e-6)
    pulled, _ = fed.one_client(get_method("ditto")(setup, DittoConfig(lamda=1.0 / fed.LR)), {"variables": v0},
                            server=server)
    start, gap_free, gap_pulled = (_sq_dist(m["params"], w["params"]) for m in
                                   (v0, free["variables"], pulled["variables"]))
    assert gap_free > 0.5 * start
    assert gap_pulled < 1e-3 * start


@pytest.mark.parametrize("config_type,options", [
    (DittoConfig, {"lamda": -1.0}), (DittoConfig, {"lamda": float("inf")}),
])
def test_bad_options_raise_user_error(config_type, options):
    with pytest.raises(UserError):
        config_lib.method_options(config_type, options)
