"""FedALA: adaptive local aggregation (weights at one take the global model, lower layers always
do, skipped while local equals global), layers in forward order, and option errors.

The federation: tests/split_model_federation.py. The engine against a
per-client loop: tests/test_engine_equals_loop_split_models.py; learning on
real Fashion-MNIST: tests/test_learning_fmnist_four_clients.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import split_model_federation as fed
from fedjax_pfl.core import tree_ops
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import ClientData, stack_clients
from fedjax_pfl.kernels.adaptive_aggregation import layer_paths
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.fedala import FedALAConfig
from fedjax_pfl.runs import config as config_lib


def _ala(method, local, glob, weights, started, data, key):
    client = {"variables": local, "weights": weights, "started": jnp.asarray(started)}
    return jax.jit(method.adaptive_local_aggregation)(glob, client, data, key)


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
    assert set(method.top_layers) == {("body", "mlp", "dense0"), ("head", "logits")}
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
        get_method("fedala")(fed.setup(fed.mlp()), FedALAConfig(layers=4))
    for bad in ({"rand_percent": 0}, {"layers": 0}, {"eta": 0.0}):
        with pytest.raises(UserError, match="method."):
            config_lib.method_options(FedALAConfig, bad)
