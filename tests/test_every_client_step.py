"""The engine's every-client step (`Schedule.updates_every_client`, FedALA's): after each round's
server step it runs on all clients, selected or not, with `every_client_keys`, and fused rounds,
every client mapping and federations of one program (engine/rows.py) give the same as single rounds.

A counting method stands for FedALA here; FedALA itself: tests/test_fedala.py. The federation:
tests/plain_sgd_federation.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import plain_sgd_federation as plain_fed
from engine_rows import run_rows
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.methods.base import Algorithm, Paper, Schedule
from settings_records import engine_config


# A method whose every-client step counts, per client, the steps it took and records what it saw.


def _init(m, key, num_clients):
    clients = {"steps": jnp.zeros(num_clients, jnp.int32), "version": jnp.zeros(num_clients, jnp.int32),
               "n": jnp.zeros(num_clients, jnp.int32), "draw": jnp.zeros(num_clients)}
    return {"variables": m.model.init(key), "version": jnp.zeros((), jnp.int32)}, clients


def _client_update(m, server, client, data, key, info):
    return client, {"loss": jnp.zeros(())}


def _server_update(m, server, clients, uploads, info):
    return {**server, "version": server["version"] + 1}, clients


def _update_every_client(m, server, client, data, key, round_index):
    return {"steps": client["steps"] + 1, "version": server["version"], "n": data.n, "draw": jax.random.uniform(key)}


def _eval_variables(m, server, client, data, key):
    return server["variables"]


_COUNTING = Algorithm(name="counting", paper=Paper("Counting"), schedule=Schedule(updates_every_client=True),
                      init=_init, client_update=_client_update, server_update=_server_update,
                      update_every_client=_update_every_client, eval_variables=_eval_variables)


def _counting_engine(mapping="vmap"):
    train = plain_fed.train_data()
    config = engine_config(2, client_mapping=mapping)
    return engine_lib.Engine(_COUNTING(plain_fed.setup()), train, train, config), train


def test_every_client_step_runs_on_all_clients_after_the_server_step():
    eng, train = _counting_engine()
    key = jax.random.key(0)
    server, clients = eng.init(key)
    for t in range(3):
        round_key = engine_lib.round_keys(key, t)[0]
        server, clients, metrics = eng.round(server, clients, round_key, t)
        assert len(set(np.asarray(metrics["selected"]).tolist())) == 2  # 2 of 5 selected, all 5 stepped
        np.testing.assert_array_equal(clients["steps"], t + 1)
        np.testing.assert_array_equal(clients["version"], t + 1)  # the server state after this round's step
        np.testing.assert_array_equal(clients["n"], train.n)
        want = jax.vmap(jax.random.uniform)(engine_lib.every_client_keys(round_key, len(plain_fed.SIZES)))
        np.testing.assert_array_equal(clients["draw"], want)


@pytest.mark.parametrize("mapping", ["map", "chunked", "vmap"])
def test_every_client_step_under_fused_rounds_mappings_and_federations(mapping):
    """4 rounds in one fused call (any mapping) == 4 single calls; 2 seeds as federations == each alone."""
    eng, _ = _counting_engine(mapping)
    key = jax.random.key(1)
    server, clients = eng.init(key)
    for t in range(4):
        server, clients, _ = eng.round(server, clients, engine_lib.round_keys(key, t)[0], t)
    want = plain_fed.host((server, clients))
    fused = eng.run_rounds(*eng.init(key), key, 0, 4, 4, 2)[:2]
    jax.tree.map(np.testing.assert_array_equal, plain_fed.host(fused), want)
    keys = jnp.stack([key, jax.random.key(7)])
    pool, servers, stacked, _, _ = run_rows(eng, keys, keys, 4, 2)
    jax.tree.map(np.testing.assert_array_equal, plain_fed.host(pool.state(servers, stacked, 0)), want)
    other = eng.run_rounds(*eng.init(jax.random.key(7)), jax.random.key(7), 0, 4, 4, 2)[:2]
    jax.tree.map(np.testing.assert_array_equal, plain_fed.host(pool.state(servers, stacked, 1)), plain_fed.host(other))
