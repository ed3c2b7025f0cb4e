"""Collaboration diagnostics (kernels/collaboration.py, Method.round_diagnostics): the summaries against
float64 NumPy, the channel from a method's hook to the round metrics and metrics.jsonl records (the run
folder's files: tests/test_results.py). That each method that weights other clients' models mixes them
under its defaults is checked in its learning test on real data (tests/mixing_check.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import plain_sgd_federation as plain_fed
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.kernels import collaboration
from fedjax_pfl.methods import get_method, method_names
from fedjax_pfl.methods.base import ServerRound, no_diagnostics
from fedjax_pfl.runs import records

# The methods whose clients' models are built from other clients' models, one weight per client (or
# per candidate model): each reports its collaboration through `round_diagnostics`.
COLLABORATING = ("fedamp", "diversifed", "fedfomo", "apple", "fedcac", "fedpac", "fedpac_proto")
# Methods that report their server step in another way: FedAS its Fisher weights and its alignment's effect
# (tests/test_fedas.py).
OTHER_REPORTING = ("fedas",)


def test_summaries_equal_float64_reference():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(3, 5))
    own = np.array([4, 0, 2])
    got = collaboration.weight_summary(jnp.asarray(weights, jnp.float32), jnp.asarray(own))
    self_w = weights[np.arange(3), own]
    others = np.abs(weights).sum(axis=1) - np.abs(self_w)
    assert float(got["self_weight"]) == pytest.approx(self_w.mean(), rel=1e-5)
    assert float(got["other_weight"]) == pytest.approx(others.mean(), rel=1e-5)

    models = {"a": rng.normal(size=(4, 3, 2)), "b": rng.normal(size=(4, 5))}
    flat = np.concatenate([models["a"].reshape(4, -1), models["b"]], axis=1)
    d = np.sqrt(((flat[:, None] - flat[None]) ** 2).sum(-1))
    off = d[~np.eye(4, dtype=bool)]
    got = collaboration.distance_summary(jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), models))
    assert float(got["distance_mean"]) == pytest.approx(off.mean(), rel=1e-4)
    assert float(got["distance_max"]) == pytest.approx(off.max(), rel=1e-4)
    one = collaboration.own_and_others(jnp.array([0.2, 0.3, 0.5]), jnp.array([False, True, False]))
    assert float(one["self_weight"]) == pytest.approx(0.3) and float(one["other_weight"]) == pytest.approx(0.7)


def test_every_method_with_diagnostics_is_checked_here():
    reporting = {name for name in method_names()
                 if get_method(name).round_diagnostics is not no_diagnostics}
    assert reporting == set(COLLABORATING) | set(OTHER_REPORTING)


def test_round_diagnostics_are_scalars_or_one_value_per_selected_client():
    def reporting(shape):
        """A method whose diagnostics are ``self_weight`` of ``shape`` and a scalar ``mean``."""
        def round_diagnostics(m, server, new_server, uploads, info):
            return {"self_weight": jnp.ones(shape), "mean": 0.5}

        algorithm = dataclasses.replace(get_method("local"), name="reporting", round_diagnostics=round_diagnostics)
        return algorithm(plain_fed.setup())

    info = ServerRound(jnp.int32(0), jnp.array([4, 0, 2]), jnp.ones(3), jnp.ones(3, bool))
    scalars, per_client = engine_lib.round_diagnostics(reporting((3,)), {}, {}, {}, info)
    assert set(scalars) == {"mean"} and per_client["self_weight"].shape == (3,)
    with pytest.raises(ValueError, match="self_weight"):
        engine_lib.round_diagnostics(reporting((2,)), {}, {}, {}, info)


def test_records_carry_the_diagnostics_of_their_round():
    metrics = {"train_loss": np.array([0.5, 0.4]), "client_loss": np.zeros((2, 3)),
               "diagnostics": {"self_weight": np.array([0.9, 0.8], np.float32)}}
    per_round = records.rounds_of_call(metrics, 2)
    assert float(per_round[1]["diagnostics"]["self_weight"]) == pytest.approx(0.8)
    per_client = {"correct": np.array([3.0]), "count": np.array([4.0]), "loss_sum": np.array([2.0])}
    record = records.evaluation_record(per_client, per_round[1], 1, 1.0, "local")
    assert record["round"] == 2 and record["diagnostics"] == {"self_weight": pytest.approx(0.8)}
    plain = records.evaluation_record(per_client, {"train_loss": 0.1, "diagnostics": {}}, 0, 1.0, "local")
    assert "diagnostics" not in plain and "client_diagnostics" not in plain
    by_client = records.evaluation_record(per_client, {"train_loss": 0.1, "selected": np.array([7, 2]),
                                                       "client_diagnostics": {"w": np.array([0.25, 0.75])}},
                                          0, 1.0, "local")
    assert by_client["client_diagnostics"] == {"w": {"7": 0.25, "2": 0.75}}
