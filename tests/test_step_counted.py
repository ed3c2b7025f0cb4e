"""The step-counted methods that take their own plain SGD steps (methods/step_counted.py's
StepMethod): Per-FedAvg's and pFedMe's option errors, the no-BatchNorm check, and the refusal of
an optimizer they would ignore (pFedKD, which trains with the run's optimizer, accepts it)."""

import jax
import jax.numpy as jnp
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.methods import get_method
from fedjax_pfl.runs import config as config_lib
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
        get_method("pfedme")(_bn_setup()).init(jax.random.key(0), 2)


def test_a_method_with_its_own_sgd_refuses_an_optimizer_it_would_ignore():
    """pFedMe and Per-FedAvg step by hand with train.lr: Adam, momentum or decay asked of them must not be
    silently dropped (config.json would claim them). pFedKD, which trains with the run's optimizer, accepts."""
    import dataclasses

    setup = _method("pfedkd").setup
    for extra in [("train.optimizer=adam",), ("train.momentum=0.5",), ("train.weight_decay=0.0005",)]:
        richer = dataclasses.replace(setup, beyond_plain_sgd=extra)
        for name in ("pfedme", "perfedavg"):
            with pytest.raises(UserError, match=f"so {extra[0]} would be ignored"):
                get_method(name)(richer)
        get_method("pfedkd")(richer)
    for name in ("pfedme", "perfedavg"):
        get_method(name)(setup)  # plain SGD: accepted


def _bn_setup():
    """A setup whose model carries BatchNorm statistics (only ``init`` is needed)."""
    import types

    import optax

    from fedjax_pfl.methods.base import LocalSetup

    model = types.SimpleNamespace(init=lambda key: {"params": {"w": jnp.zeros(2)}, "batch_stats": {"m": jnp.zeros(2)}})
    return LocalSetup(model=model, optimizer=optax.sgd(0.1), batch_size=4, local_epochs=1, normalize=lambda x: x,
                      learning_rate=0.1)
