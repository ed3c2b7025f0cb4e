"""Seeds and grid values as federations of one program, traced hyperparameters and the lr schedule.

Each federation (engine/rows.py) must equal the single run with its seed or
value; a method reading a traced hyperparameter must equal the method built with
that value as a Python number; a per-round lr factor must equal rounds run
with the decayed lr given by hand.
"""

import functools

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.engine.lr_schedule import LrSchedule
from fedjax_pfl.methods import fedpac as fedpac_steps, get_method, gpfl as gpfl_steps
from fedjax_pfl.models.networks import build_model
from fedjax_pfl.kernels.optim import make_optimizer
from engine_rows import run_rows
from settings_records import engine_config, local_setup

SIZES = [9, 30, 3, 17, 12, 21]


def _normalize(x):
    return x.astype(jnp.float32) / 255.0 - 0.5


def _engine(method_name, options=None, lr=0.1, mapping="map", **schedule):
    """``schedule``: train.lr_schedule, lr_decay and rounds (default: a constant lr)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(sum(SIZES), 6, 6, 1), dtype=np.uint8)
    y = (x.reshape(len(x), -1).mean(1) > 127).astype(np.int32) + 2 * (x[:, 0, 0, 0] > 127)
    bounds = np.cumsum([0, *SIZES])
    data = stack_clients(x, y, [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])])
    model = build_model("mlp", (6, 6, 1), 4, hidden=(8,))
    setup = local_setup(model=model, optimizer=functools.partial(make_optimizer, "sgd", momentum=0.5, weight_decay=0.0), lr=lr,
                        batch_size=4, local_epochs=2, normalize=_normalize)
    cls = get_method(method_name)
    method = cls(setup, cls.hparams_type(**(options or {})) if cls.hparams_type else None)
    return engine_lib.Engine(method, data, data, engine_config(4, client_mapping=mapping, chunk_size=2, **schedule))


def _close(a, b, tol=2e-5):
    for la, lb in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(la, np.float64), np.asarray(lb, np.float64), rtol=tol, atol=tol)


def _single(eng, seed, rounds=3, values=None):
    init_key, key = jax.random.split(jax.random.key(seed))
    server, clients = eng.init(init_key)
    server, clients, metrics, evals = eng.run_rounds(server, clients, key, 0, rounds, rounds, 2, values=values)
    return server, clients, metrics, evals


def _federations(eng, seeds, rounds=3, values=None):
    keys = jax.vmap(lambda s: jnp.stack(jax.random.split(jax.random.key(s))))(jnp.asarray(seeds))
    return run_rows(eng, keys[:, 0], keys[:, 1], rounds, 2, values=values)


def test_each_seed_as_a_federation_equals_its_single_run():
    """FedPer (global body, own heads: server and client state both per federation); FedAvg-like
    methods are compared from the CLI in tests/test_sweep.py."""
    eng = _engine("fedper")
    seeds = [0, 5]
    pool, servers, clients, metrics, evals = _federations(eng, seeds)
    for e, seed in enumerate(seeds):
        server, client, m, ev = _single(eng, seed)
        _close(pool.state(servers, clients, e), (server, client))
        np.testing.assert_array_equal(metrics[e]["selected"], m["selected"])
        assert sorted(evals[e]) == sorted(ev) == [1, 2]
        for t in ev:
            np.testing.assert_array_equal(evals[e][t]["count"], ev[t]["count"])
            np.testing.assert_allclose(evals[e][t]["loss_sum"], ev[t]["loss_sum"], rtol=1e-4)
    assert not np.array_equal(metrics[0]["selected"], metrics[1]["selected"])  # seeds really differ


@pytest.mark.parametrize("mapping", ["map", "packed:2"])
def test_each_grid_point_equals_the_run_built_with_that_value(mapping):
    """lr and FedProx mu as traced [F] values, one a federation == methods built with the Python numbers;
    in lanes too (packed:2: a lane takes each row's values with its client)."""
    grid = [(0.1, 0.0), (0.05, 0.5)]
    eng = _engine("fedprox", {"mu": 0.01}, mapping=mapping)
    values = {"lr": jnp.asarray([g[0] for g in grid]), "mu": jnp.asarray([g[1] for g in grid])}
    pool, servers, clients, _, evals = _federations(eng, [3] * len(grid), values=values)
    for e, (lr, mu) in enumerate(grid):
        server, client, _, ev = _single(_engine("fedprox", {"mu": mu}, lr=lr, mapping="map"), 3)
        _close(pool.state(servers, clients, e), (server, client))
        np.testing.assert_allclose(evals[e][2]["loss_sum"], ev[2]["loss_sum"], rtol=1e-4)
    assert not np.allclose(evals[0][2]["loss_sum"], evals[1][2]["loss_sum"])


def test_traced_value_unknown_name_is_a_user_error():
    eng = _engine("fedavg")
    with pytest.raises(UserError, match="cannot vary mu"):
        eng.method_at({"mu": 0.1}, 0)
    assert "mu" in get_method("fedprox").hyperparameter_names
    assert "finetune_epochs" not in get_method("fedprox").hyperparameter_names


def test_exponential_lr_decay_equals_rounds_with_the_decayed_lr_by_hand():
    decayed = _engine("fedavg", lr_decay=0.5, rounds=3)
    server, clients, metrics, _ = _single(decayed, 4, rounds=3)
    plain = _engine("fedavg")
    init_key, key = jax.random.split(jax.random.key(4))
    s, c = plain.init(init_key)
    for t in range(3):
        s, c, _ = plain.round(s, c, engine_lib.round_keys(key, t)[0], t, values={"lr": 0.1 * 0.5 ** t})
    _close(server, s)
    _close(clients, c)


def test_decay_one_is_the_plain_program_and_cosine_factors():
    eng = _engine("fedavg", lr_decay=1.0, rounds=5)
    assert eng.method_at({}, 3) is eng.method
    cosine = LrSchedule("cosine", 1.0, 4)
    got = [float(cosine.factor(t)) for t in range(4)]
    np.testing.assert_allclose(got, [(1 + math.cos(math.pi * t / 4)) / 2 for t in range(4)], rtol=1e-6)
    np.testing.assert_allclose(float(LrSchedule("exponential", 0.9, 9).factor(3)), 0.9 ** 3, rtol=1e-6)


def _first_step(optimizer, params):
    """The update of one step from a fresh state on gradients of ones."""
    updates, _ = optimizer.update(jax.tree.map(jnp.ones_like, params), optimizer.init(params), params)
    return updates


def test_schedule_decays_the_run_optimizer_and_leaves_gpfl_guidance_at_train_lr():
    """Round 2 of a 0.5-per-round decay from lr 0.1: the run's optimizer steps 0.025, FedPAC's head with
    head_optimizer=run too (PFLlib's one optimizer); GPFL's valve and embeddings step train.lr, 0.1, as the
    authors' undecayed CoV_opt and GCE_opt, while its body and head take the decayed run optimizer."""
    schedule = {"lr_decay": 0.5, "rounds": 3}
    gpfl = _engine("gpfl", **schedule).method_at({}, 2)
    assert float(gpfl.lr) == pytest.approx(0.025)
    assert float(gpfl.base_lr) == pytest.approx(0.1)
    params = {"body": {"w": jnp.ones(3)}, "head": {"w": jnp.ones(2)}, "gce": jnp.ones((2, 3)), "cov": {"w": jnp.ones(4)}}
    step = _first_step(gpfl_steps.training_optimizer(gpfl), params)
    mu = gpfl.hparams.mu  # the valve's and embeddings' weight decay: lr * (g + mu * p) with g = p = 1
    for part, lr in (("body", 0.025), ("head", 0.025), ("gce", 0.1 * (1 + mu)), ("cov", 0.1 * (1 + mu))):
        for leaf in jax.tree.leaves(step[part]):
            np.testing.assert_allclose(np.asarray(leaf), -lr, rtol=1e-6, err_msg=part)
    head = {"w": jnp.ones(2)}
    pac_run = fedpac_steps.head_optimizer(
        _engine("fedpac", {"head_optimizer": "run"}, **schedule).method_at({}, 2))
    pac_authors = fedpac_steps.head_optimizer(_engine("fedpac", **schedule).method_at({}, 2))
    np.testing.assert_allclose(np.asarray(_first_step(pac_run, head)["w"]), -0.025, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(_first_step(pac_authors, head)["w"]), -0.1 * (1 + 5e-4), rtol=1e-6)
