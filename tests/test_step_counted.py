"""The step-counted methods that take their own plain SGD steps (methods/step_counted.py's
StepMethod): Per-FedAvg's and pFedMe's option errors, the no-BatchNorm check, and the refusal of
an optimizer they would ignore (pFedKD, which trains with the run's optimizer, accepts it)."""

import jax
import jax.numpy as jnp
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.runs import config as config_lib
from settings_records import local_setup, run_facts
from test_pfedkd import _method


def test_bad_options_raise_user_error():
    bad = {
        "perfedavg": [{"beta": 0.0}, {"alpha": -1.0}, {"variant": "so"}, {"local_steps": 0}, {"eval_steps": 0},
                      {"lamda": 1.0}],
        "pfedme": [{"lamda": 0.0}, {"personal_lr": -0.1}, {"K": 0}, {"beta": -1.0}, {"local_steps": 1.5},
                   {"mu": 0.1}, {"theta_start": "local"}, {"aggregate": "mean"}],
    }
    for name, options in bad.items():
        cls = get_method(name)
        for o in options:
            with pytest.raises(UserError):
                config_lib.method_options(cls.hparams_type, o)
    assert config_lib.method_options(get_method("pfedme").hparams_type, {}).lamda == 15.0
    with pytest.raises(UserError):  # a BatchNorm model is refused
        get_method("pfedme").check_run(None, run_facts(_bn_setup()))


def test_a_method_with_its_own_sgd_refuses_an_optimizer_it_would_ignore():
    """pFedMe and Per-FedAvg step by hand with train.lr: Adam, momentum or decay asked of them must not be
    silently dropped (config.json would claim them). pFedKD, which trains with the run's optimizer, accepts."""
    import dataclasses

    setup = _method("pfedkd").setup
    for extra in [("train.optimizer=adam",), ("train.momentum=0.5",), ("train.weight_decay=0.0005",)]:
        richer = dataclasses.replace(setup, beyond_plain_sgd=extra)
        for name in ("pfedme", "perfedavg"):
            with pytest.raises(UserError, match=f"so {extra[0]} would be ignored"):
                get_method(name).check_run(None, run_facts(richer))
        get_method("pfedkd").check_run(None, run_facts(richer))
    for name in ("pfedme", "perfedavg"):
        get_method(name).check_run(None, run_facts(setup))  # plain SGD: accepted


def _bn_setup():
    """A setup whose model carries BatchNorm statistics (only ``init`` is needed)."""
    import types

    import optax

    
    model = types.SimpleNamespace(init=lambda key: {"params": {"w": jnp.zeros(2)}, "batch_stats": {"m": jnp.zeros(2)}})
    return local_setup(model=model, optimizer=optax.sgd, lr=0.1, batch_size=4, local_epochs=1, normalize=lambda x: x)


@pytest.mark.parametrize("name,options", [("fedavg", {"local_steps": 3}), ("fedprox", {"local_steps": 3, "mu": 0.5})])
def test_fedavg_and_fedprox_take_r_random_batch_steps_with_local_steps(name, options):
    """method.local_steps=R (pFedKD-WCL's paper's protocol for its baselines): R plain SGD steps, each on one
    random batch that `random_batch` draws from the step's key, from the global model, as a per-step loop
    computes them (FedProx with its proximal term); a straggler takes max(1, R e // E)."""
    import numpy as np

    from fedjax_pfl import losses
    from fedjax_pfl.data.client_data import ClientData, stack_clients
    from fedjax_pfl.methods.base import ClientRound
    from fedjax_pfl.methods.step_counted import random_batch
    from test_pfedkd import SIZES, _data

    method = _method(name, **options)
    x, y, idx = _data()
    train = stack_clients(x, y, idx)
    data = ClientData(train.x[2], train.y[2], train.n[2])
    server, clients = method.init(jax.random.key(0), len(SIZES))
    client = jax.tree.map(lambda a: a[2], clients)
    key = jax.random.key(5)
    mu = options.get("mu", 0.0)
    anchor = server["variables"]["params"]

    def reference(steps):
        params = anchor
        for k in jax.random.split(key, 3)[:steps]:
            k_step, k_batch = jax.random.split(k)
            batch = random_batch(k_batch, data, method.setup.batch_size, method.setup.normalize)

            def loss(p):
                logits = method.model.apply({"params": p}, batch.x, train=True).logits
                return losses.cross_entropy(logits, batch.y, batch.mask) + mu * losses.proximal(p, anchor)

            params = jax.tree.map(lambda a, g: a - 0.1 * g, params, jax.grad(loss)(params))
        return params

    for epochs, steps in [(4, 3), (1, 1)]:  # E = 4 (the setup's local_epochs): a straggler at e = 1 takes 1 step
        _, upload = jax.jit(method.client_update)(server, client, data, key, ClientRound(jnp.int32(1), jnp.int32(epochs)))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                     upload["variables"]["params"], reference(steps))
    plain = _method(name, **{k: v for k, v in options.items() if k != "local_steps"})
    _, epochs_upload = jax.jit(plain.client_update)(server, client, data, key, ClientRound(jnp.int32(1), jnp.int32(4)))
    assert not np.allclose(jax.tree.leaves(epochs_upload["variables"])[0], jax.tree.leaves(upload["variables"])[0])
