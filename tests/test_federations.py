"""Federations as rows of one program (engine/rows.py) against each federation run alone.

Four federations of one method in one compiled program: two share a
partition of six ragged clients (one empty, one smaller than a batch) and
differ in seed and in clients sampled a round (4 and 2), a third has four
clients of another partition (other client count, other sizes) and 3
sampled, a fourth repeats the first's shape with another seed (so two of
them share one vmapped server step). Each federation's round metrics,
evaluations and final state equal its lone `Engine` run with the same keys:
integer state exactly, floats to 1e-10 in float64. Methods: FedAvg, FedAS
(four client passes and Fisher-weighted aggregation), FedPAC (the server
combines the selected clients' heads: it reads their stacked state), Ditto
(a personal model beside the global one), FedPer (a personal head) and FedALA
(a step on every client after the server's); the rows train packed into
lanes, each lone run one client at a time.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.data.client_data import stack_clients
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.engine.rows import Federation, FederationRows, refusal
from fedjax_pfl.methods import get_method
from fedjax_pfl.models.networks import build_model
from settings_records import engine_config, local_setup

ROUNDS = 2
METHODS = ["fedavg", "fedas", "fedpac", "ditto", "fedper", "fedala"]
# FedPAC's feature statistics are float32 (kernels/prototypes.py) and its server's QP over them amplifies their
# rounding, which differs between a vmapped and a one-client program (tests/test_packed_lanes.py, the same)
TOLERANCE = {"fedpac": 1e-4}


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


def _partition(sizes, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (sum(sizes), 4, 4, 1), dtype=np.uint8)
    y = rng.integers(0, 3, sum(sizes)).astype(np.int32)
    return stack_clients(x, y, np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1]))


def _federations():
    first = (_partition([23, 3, 0, 11, 16, 7], 0), _partition([5, 4, 3, 6, 2, 7], 1))
    other = (_partition([30, 5, 12, 9], 2), _partition([6, 3, 4, 5], 3))
    return [Federation(*first, None, 4), Federation(*first, None, 2), Federation(*other, None, 3),
            Federation(*first, None, 4)]


def _method(name, augment=None):
    setup = local_setup(model=build_model("mlp", (4, 4, 1), 3, hidden=(6,)),
                        optimizer=functools.partial(optax.sgd, momentum=0.5), lr=0.1, batch_size=5, local_epochs=2,
                        normalize=lambda a: a.astype(jnp.float64) / 255.0 - 0.5, augment=augment)
    return get_method(name)(setup)


def _as_float64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _assert_equal(got, want, what, tol=1e-10):
    """Leaf by leaf: integers, booleans and keys exactly; float64 to ``tol``; float32 values (what a method keeps
    in float32, e.g. evaluation sums) to 1e-5, their rounding differs between mappings."""
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True):
        a, b = (np.asarray(jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v)
                for v in (a, b))
        where = f"{what} {jax.tree_util.keystr(path)}"
        if np.issubdtype(a.dtype, np.floating):
            close = tol if a.dtype == np.float64 else max(tol, 1e-5)
            np.testing.assert_allclose(a, b, rtol=close, atol=close, err_msg=where)
        else:  # integer and boolean state, keys: exact
            np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize("name", METHODS)
def test_each_federation_of_a_pool_equals_its_lone_run(name, float64):
    method, federations, seeds = _method(name), _federations(), [0, 1, 2, 3]
    keys = [jax.random.split(jax.random.key(s)) for s in seeds]
    pool = FederationRows(method, federations, engine_config(1, client_mapping="packed:3"))
    assert str(pool.mapping) == "packed:3" and len(pool.groups) == 3  # the first and the fourth share a server step
    servers, clients = _as_float64(pool.init(jnp.stack([k[0] for k in keys])))
    servers, clients, metrics, evaluations = pool.run_rounds(servers, clients, jnp.stack([k[1] for k in keys]), 0,
                                                             ROUNDS, ROUNDS, 1)
    for f, federation in enumerate(federations):
        eng = engine_lib.Engine(method, federation.train, federation.test,
                                engine_config(federation.clients_per_round, client_mapping="map"))
        server, lone_clients = _as_float64(eng.init(keys[f][0]))
        server, lone_clients, lone_metrics, lone_evaluations = eng.run_rounds(server, lone_clients, keys[f][1], 0,
                                                                              ROUNDS, ROUNDS, 1)
        what, tol = f"{name} federation {f}", TOLERANCE.get(name, 1e-10)
        _assert_equal(pool.state(servers, clients, f), (server, lone_clients), what, tol)
        shared = ("selected", "epochs", "uploaded", "client_loss", "train_loss", "real_steps", "diagnostics",
                  "round", "active")
        _assert_equal({k: metrics[f][k] for k in shared}, {k: lone_metrics[k] for k in shared}, f"{what} metrics",
                      tol)
        assert sorted(evaluations[f]) == sorted(lone_evaluations) == list(range(ROUNDS))
        _assert_equal(evaluations[f], lone_evaluations, f"{what} evaluations", tol)
        assert metrics[f]["selected"].shape == (ROUNDS, federation.clients_per_round)
    # the seeds matter: federations 0 and 3 (one partition, one shape) trained apart
    assert not np.allclose(jax.tree.leaves(pool.state(servers, clients, 0))[0],
                           jax.tree.leaves(pool.state(servers, clients, 3))[0])


def test_a_pool_equals_itself_under_every_client_mapping(float64):
    """The rows mapped one at a time, vmapped (each federation's rows with its server state), in chunks and in
    lanes: the same state, losses and evaluations."""
    method, federations = _method("fedavg"), _federations()
    keys = jax.random.split(jax.random.key(0), (len(federations), 2))
    results = []
    for mapping in ("map", "vmap", "chunked", "packed:2"):
        pool = FederationRows(method, federations, engine_config(1, client_mapping=mapping, chunk_size=3))
        servers, clients = _as_float64(pool.init(keys[:, 0]))
        servers, clients, metrics, evaluations = pool.run_rounds(servers, clients, keys[:, 1], 0, ROUNDS, ROUNDS, 1)
        results.append((servers, clients, [m["train_loss"] for m in metrics], evaluations))
        assert all(m["real_steps"].sum() <= m["executed_steps"].sum() for m in metrics)
    for got in results[1:]:
        _assert_equal(got, results[0], "pool against map")


def _init_with_a_count_per_client(m, key, num_clients):
    server, clients = get_method("fedavg").init(m, key, num_clients)
    return {**server, "seen": jnp.zeros(num_clients)}, clients


_ServerPerClient = dataclasses.replace(get_method("fedavg"), name="server_per_client",
                                       init=_init_with_a_count_per_client)


def test_what_cannot_be_rows_exactly_is_refused_in_one_line():
    federations = _federations()
    cases = [
        (_ServerPerClient(_method("fedavg").setup), federations, "server state sized by the number of clients"),
        (_method("fedavg", augment=lambda key, x: x), federations, "train.augment"),
        (_method("fedavg"), [federations[0], Federation(federations[2].train, federations[2].test,
                                                        federations[2].train, 3)], "validation data"),
    ]
    config = engine_config(1)
    for method, feds, message in cases:
        why = refusal(method, feds, config)
        assert why is not None and message in why and "\n" not in why, (method.name, why)
        with pytest.raises(UserError, match=message):
            FederationRows(method, feds, config)
    # the same setups with federations of one shape are rows
    same = [federations[0], federations[1], federations[3]]
    assert refusal(_ServerPerClient(_method("fedavg").setup), same, config) is None
    assert refusal(_method("fedavg", augment=lambda key, x: x), same, config) is None


def _argv(root, name, cell, extra=()) -> list[str]:
    """The training command line of a small synthetic run ``name`` under ``root``."""
    return ["--method", "fedavg", "data.name=synthetic", "partition.scheme=dirichlet", "partition.num_clients=5",
            "model.name=mlr", "train.rounds=3", "train.local_epochs=1", "train.batch_size=16",
            "train.rounds_per_call=2", "checkpoint_every=2", "data_seed=5", *extra, *cell, "--out", str(root / name)]


def _run_configs(root, cells, extra=()):
    from fedjax_pfl.cells.cell_command import build_config

    return [build_config(_argv(root, name, cell, extra)) for name, cell in cells.items()]


def test_runs_that_differ_in_partition_participation_and_seed_write_their_single_runs_folders(tmp_path, monkeypatch):
    """`runs.sweep.run_federations`: three runs (two share a partition) as rows of one program, each writing the
    run folder its single run writes: the same records, the same config, a checkpoint."""
    import json

    from fedjax_pfl.commands import train
    from fedjax_pfl.outputs import results_writer, run_folder
    from fedjax_pfl.runs.sweep import run_federations

    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    cells = {"a": ["partition.alpha=0.3", "train.join_ratio=0.6", "--seed", "0"],
             "b": ["partition.alpha=1.0", "train.join_ratio=1.0", "--seed", "1"],
             "c": ["partition.alpha=0.3", "train.join_ratio=0.4", "--seed", "2"]}
    summaries = run_federations(_run_configs(tmp_path / "rows", cells), progress=False)
    assert [s["status"] for s in summaries] == ["finished"] * 3
    for name, cell in cells.items():
        assert train.main([*_argv(tmp_path / "alone", name, cell), "--no-progress"]) == 0
        rows, single = tmp_path / "rows" / name, tmp_path / "alone" / name
        for key in ("accuracy", "accuracy_weighted", "loss", "train_loss"):
            np.testing.assert_allclose([r[key] for r in run_folder.read_records(rows)],
                                       [r[key] for r in run_folder.read_records(single)], rtol=1e-6, err_msg=key)
        saved = [json.loads((f / "config.json").read_text())["config"] for f in (rows, single)]
        assert {**saved[0], "out": None} == {**saved[1], "out": None}
        assert (rows / "checkpoint").is_dir()


def test_runs_that_differ_in_more_than_rows_may_are_refused_in_one_line(tmp_path):
    from fedjax_pfl.runs.sweep import run_federations

    cfgs = _run_configs(tmp_path, {"a": ["--seed", "0"]}) + _run_configs(tmp_path, {"b": ["--seed", "1"]},
                                                                        ["train.lr=0.5"])
    with pytest.raises(UserError, match="not in train.lr"):
        run_federations(cfgs, progress=False)
    assert not (tmp_path / "a").exists()


TABLE = """
paper: "Tiny paper"
table: "Table 0"
metric: best
seeds: [0, 1]
grid:
  overrides: [data.name=synthetic, partition.scheme=dirichlet, partition.num_clients=5, data_seed=3, model.name=mlr,
              train.rounds=2, train.local_epochs=1, train.batch_size=16, train.rounds_per_call=1]
  axes:
    - {name: a, key: partition.alpha, values: [0.3, 1.0]}
    - {name: P, key: train.join_ratio, values: [0.4, 1]}
methods:
  - {name: global, method: fedavg}
  - local
"""


def test_the_table_command_trains_a_methods_cells_as_rows_and_equals_them_one_by_one(tmp_path, monkeypatch, capsys):
    """reproduce: each method's new cells (two alphas x two join ratios x two seeds) as rows of one program;
    with --one-by-one each alone: the same records. --cells with ';' ends a program."""
    from fedjax_pfl.outputs import results_writer, run_folder
    from fedjax_pfl.cells import reproduce

    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    table = tmp_path / "tiny.yaml"
    table.write_text(TABLE)
    base = ["--table-file", str(table), "--no-progress"]
    assert reproduce.main([*base, "--out", str(tmp_path / "rows")]) == 0
    printed = capsys.readouterr().out
    assert "global-a0.3_P0.4/seed0: new, row 1 of 8 in one program: python -m fedjax_pfl.train" in printed
    assert "local-a1.0_P1/seed1: new, row 8 of 8 in one program" in printed
    assert reproduce.main([*base, "--out", str(tmp_path / "alone"), "--one-by-one"]) == 0
    assert "in one program" not in capsys.readouterr().out
    cells = [f"{m}-a{a}_P{p}/seed{s}" for m in ("global", "local") for a in ("0.3", "1.0") for p in ("0.4", "1")
             for s in (0, 1)]
    for cell in cells:
        rows, alone = (run_folder.read_records(tmp_path / mode / "runs" / cell) for mode in ("rows", "alone"))
        np.testing.assert_allclose([r["accuracy"] for r in rows], [r["accuracy"] for r in alone], rtol=1e-6,
                                   err_msg=cell)
    listed = "global-a0.3_P0.4/seed0,global-a1.0_P1/seed0;global-a0.3_P1/seed0"
    assert reproduce.main([*base, "--out", str(tmp_path / "listed"), "--cells", listed, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "global-a1.0_P1/seed0: new, row 2 of 2 in one program" in printed
    assert "global-a0.3_P1/seed0: new: python" in printed
