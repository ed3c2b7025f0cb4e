"""Ditto, APFL, FedAMP, FedProto and Local learn on real Fashion-MNIST, and the personalized
models beat FedAvg's global one there (each paper's table, pathological label skew), in
tests/fmnist_two_class.py's setting: one FedAvg run of the same 3 rounds on the same clients is
the bar of all five, trained once in this file; each method's own learned state is checked too.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fmnist_two_class
import majority_baseline
import pfl_reference as ref
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.methods import fedamp, get_method
from fedjax_pfl.methods.fedproto import FedProtoConfig
from fedjax_pfl.runs import config as config_lib


@pytest.fixture(scope="module")
def fmnist_experiment(data_dir):
    """10 FMNIST clients, 2 classes each, 150/50 samples, MLP 64, Adam 1e-3, all clients per round."""
    from fedjax_pfl.runs.experiment import build_experiment, validate

    overrides = fmnist_two_class.overrides(data_dir, "local")
    return build_experiment(validate(config_lib.build(None, overrides))).engine


@pytest.fixture(scope="module")
def fmnist_fedavg_accuracy(fmnist_experiment):
    """FedAvg's accuracy after the same 3 rounds on the same clients."""
    return ref.accuracy_of("fedavg", fmnist_experiment, 3)


@pytest.mark.parametrize("method_name", ["ditto", "apfl", "fedamp", "fedproto", "local"])
def test_learns_on_fmnist(method_name, fmnist_experiment, fmnist_fedavg_accuracy):
    base = fmnist_experiment
    eng = engine_lib.Engine(get_method(method_name)(base.method.setup), base.train, base.test, base.config)
    first, last, metrics, server, clients = ref.run_engine(eng, 3)
    assert math.isfinite(last["loss"]) and math.isfinite(float(metrics["train_loss"]))
    majority = majority_baseline.from_engine(eng)
    assert first < 0.3 and last["accuracy"] > majority + 0.3, (first, last, majority)
    # personalized models beat FedAvg's global one on pathological label skew (each paper's table)
    assert last["accuracy"] > fmnist_fedavg_accuracy + 0.2, (last, fmnist_fedavg_accuracy)
    if method_name == "fedproto":  # the prototypes classify too (the flag), and they are all present
        assert bool(jnp.all(server["present"]))
        by_proto = engine_lib.Engine(get_method("fedproto")(base.method.setup, FedProtoConfig(eval_by="prototype")),
                                     base.train, base.test, base.config)
        eval_key = jax.random.split(jax.random.key(0))[1]  # run_engine's evaluation key
        assert by_proto.evaluate_summary(server, clients, eval_key)["accuracy"] > majority + 0.25
    if method_name == "apfl":
        alpha = np.asarray(clients["alpha"])
        assert np.all((alpha >= 0) & (alpha <= 1)) and np.any(alpha != 0.5)
    if method_name == "fedamp":  # the server step mixes: off-diagonal weights are non-zero
        _, xi = fedamp.anchors(eng.method, server, jnp.arange(10))
        assert float(jnp.max(jnp.abs(xi - jnp.diag(jnp.diag(xi))))) > 1e-4
