"""FedALA: adaptive local aggregation (weights at one take the global model, lower layers always
do, skipped while local equals global), layers in forward order, and option errors; as its
authors run it, ALA on every client after each round (selected or not, and evaluated so) and a
weight-learning loss that padding rows do not reach.

The federations: tests/split_model_federation.py, tests/plain_sgd_federation.py. The engine
against a per-client loop: tests/test_engine_equals_loop_split_models.py; learning on real
Fashion-MNIST: tests/test_learning_fmnist_four_clients.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import batchnorm_padding as padding
import plain_sgd_federation as plain_fed
import split_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import adaptive_aggregation as ala
from fedjax_pfl.kernels.adaptive_aggregation import layer_paths
from fedjax_pfl.methods import fedala, get_method
from fedjax_pfl.methods.fedala import FedALAConfig
from fedjax_pfl.runs import config as config_lib
from settings_records import engine_config, run_facts


def _ala(method, local, glob, weights, started, data, key):
    client = {"variables": local, "weights": weights, "started": jnp.asarray(started)}
    return jax.jit(functools.partial(fedala.adaptive_local_aggregation, method, method.local))(glob, client, data, key)


def _ala_case(hparams):
    model = fed.mlp()
    method = get_method("fedala")(fed.setup(model), hparams)
    server, clients = method.init(jax.random.key(0), 1)
    local = jax.tree.map(lambda a: a[0], clients["variables"])
    glob = jax.tree.map(lambda a: a + 0.05 * jnp.sign(a + 0.01), server["variables"])
    x, y, idx = fed.raw()
    data = ClientData(*tree_ops.gather(tuple(stack_clients(x, y, idx)), 1))
    weights = jax.tree.map(lambda a: a[0], clients["weights"])
    return method, local, glob, weights, data


def test_fedala_weights_at_one_take_the_global_model_and_lower_layers_always_do():
    method, local, glob, weights, data = _ala_case(FedALAConfig(eta=1e-12))  # W stays at 1
    variables, w, started = _ala(method, local, glob, weights, True, data, jax.random.key(1))
    fed.close(variables, glob, tol=1e-6)
    assert bool(started)
    method, local, glob, weights, data = _ala_case(FedALAConfig(eta=1e4, layers=2))
    variables, w, _ = _ala(method, local, glob, weights, False, data, jax.random.key(1))
    w = np.concatenate([np.ravel(a) for a in jax.tree.leaves(w)])
    assert w.min() >= 0 and w.max() <= 1 and (w == 0).any() and (w < 1).mean() > 0.1  # learned and clipped
    assert set(method.static) == {("body", "mlp", "dense0"), ("head", "logits")}
    # no lower layer here; with layers=1 the body takes the global values exactly
    method, local, glob, weights, data = _ala_case(FedALAConfig(eta=1e4))
    variables, w, _ = _ala(method, local, glob, weights, False, data, jax.random.key(1))
    fed.close(variables["params"]["body"], glob["params"]["body"], tol=0)
    assert not np.allclose(variables["params"]["head"]["logits"]["kernel"], glob["params"]["head"]["logits"]["kernel"])


def test_fedala_skips_while_local_equals_global():
    method, local, _, weights, data = _ala_case(FedALAConfig(eta=1e4))
    variables, w, started = _ala(method, local, local, weights, False, data, jax.random.key(1))
    fed.close(variables, local, tol=0)
    fed.close(w, weights, tol=0)
    assert not bool(started)


def test_fedala_layers_follow_forward_order_and_bad_options_fail():
    # the dict's (flax creation) order, not the alphabetical order a pytree flattening gives
    z = np.zeros(1)
    params = {"body": {"stem_conv": {"kernel": z}, "stem_bn": {"scale": z, "bias": z},
                       "block": {"conv0": {"kernel": z}, "bn0": {"scale": z}}}, "head": {"logits": {"kernel": z}}}
    assert layer_paths(params) == [("body", "stem_conv"), ("body", "stem_bn"), ("body", "block", "conv0"),
                                   ("body", "block", "bn0"), ("head", "logits")]
    with pytest.raises(UserError, match="exceeds"):
        get_method("fedala").check_run(FedALAConfig(layers=4), run_facts(fed.setup(fed.mlp())))
    for bad in ({"rand_percent": 0}, {"layers": 0}, {"eta": 0.0}):
        with pytest.raises(UserError, match="method."):
            config_lib.method_options(FedALAConfig, bad)


def test_fedala_updates_and_evaluates_clients_that_were_not_selected():
    """After every round each client, selected or not, holds the ALA of its model with the NEW global model:
    its body equals the new global body (layers=1 adapts the head alone), and a client that did not train
    this round changed anyway."""
    method = plain_fed.method("fedala", layers=1)
    train = plain_fed.train_data()
    eng = engine_lib.Engine(method, train, train, engine_config(2, client_mapping="vmap"))
    key = jax.random.key(3)
    server, clients = eng.init(key)
    for t in range(3):
        before = plain_fed.host(clients)
        server, clients, metrics = eng.round(server, clients, engine_lib.round_keys(key, t)[0], t)
        idle = sorted(set(range(len(plain_fed.SIZES))) - set(np.asarray(metrics["selected"]).tolist()))
        assert len(idle) == 3
        for c in range(len(plain_fed.SIZES)):  # layers=1: the whole body is the new global body
            body = tree_ops.gather(clients["variables"], c)["params"]["body"]
            jax.tree.map(np.testing.assert_array_equal, plain_fed.host(body),
                         plain_fed.host(server["variables"])["params"]["body"])
        for c in idle:
            old, new = (tree_ops.gather(v["variables"]["params"]["head"], c) for v in (before, clients))
            assert not np.allclose(old["logits"]["kernel"], new["logits"]["kernel"]), (t, c)
        assert bool(np.all(clients["started"]))  # every client ran ALA in round 0 already
    # evaluation tests that ALA-initialised model
    data = ClientData(*tree_ops.gather(tuple(train), 0))
    got = method.eval_variables(server, tree_ops.gather(clients, 0), data, key)
    jax.tree.map(np.testing.assert_array_equal, got, tree_ops.gather(clients["variables"], 0))


def test_fedala_weight_learning_loss_ignores_padding_rows():
    method = plain_fed.method("fedala", padding.bn_setup())
    server, clients = method.init(jax.random.key(0), 1)
    base = server["variables"]
    local_top = ala.top_of(base["params"], method.static)
    global_top = jax.tree.map(lambda a: a + 0.1, local_top)
    weights = {"params": jax.tree.map(lambda a: 0.5 * a[0], clients["weights"])}
    padding.assert_same_over_padding(fedala.ala_objective(method, base, local_top, global_top), weights)
