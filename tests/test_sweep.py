"""Seeds and grid points run as federations of one program from the CLI (runs/sweep.py, engine/rows.py).

Each point's run folder must be what the single run with that seed and value
writes: the same config (but --out) and the same metrics within float
tolerance; sweep.json must aggregate the points' own summaries.
"""

import json

import jax
import numpy as np
import pytest

from fedjax_pfl.commands import train
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.runs import config as config_lib, sweep
from fedjax_pfl.runs.experiment import build_experiment, validate
from fedjax_pfl.engine import engine as engine_lib, mapping_choice
from fedjax_pfl.engine.rows import FederationRows
from engine_rows import rows_of

TINY = ["--dataset", "synthetic", "--model", "mlr", "--num-clients", "6", "--partition", "natural",
        "--local-epochs", "1", "--batch-size", "8", "--rounds", "3", "--no-progress", 
        "partition.val_fraction=0.25"]


def _json(path):
    return json.loads(path.read_text())


def _metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sw"
    assert train.main(["--method", "fedprox", *TINY, "--seeds", "1,2", "--seed", "7", "method.mu=[0,0.5]",
                       "train.lr=0.2", "--out", str(out)]) == 0
    return out


def test_each_point_equals_the_single_run_with_its_seed_and_value(swept, tmp_path):
    single = tmp_path / "single"
    assert train.main(["--method", "fedprox", *TINY, "--seed", "2", "data_seed=7", "method.mu=0.5", "train.lr=0.2",
                       "--out", str(single)]) == 0
    point = swept / "mu0.5" / "seed2"
    want, got = _json(single / "config.json")["config"], _json(point / "config.json")["config"]
    assert {k for k in want if want[k] != got[k]} == {"out"}
    assert got["seed"] == 2 and got["data_seed"] == 7 and got["method"]["mu"] == 0.5
    a, b = _metrics(single), _metrics(point)
    assert [r["round"] for r in a] == [r["round"] for r in b] == [1, 2, 3]
    for key in ("accuracy", "loss", "val_accuracy", "train_loss"):
        np.testing.assert_allclose([r[key] for r in b], [r[key] for r in a], rtol=1e-5, atol=1e-6)
    assert _json(point / "summary.json")["status"] == "finished"


def test_sweep_summary_aggregates_the_points_and_picks_by_validation(swept):
    summary = _json(swept / "sweep.json")
    rows = {r["point"]: r for r in summary["points"]}
    assert set(rows) == {"mu0", "mu0.5"}
    for name, row in rows.items():
        finals = [_json(swept / name / f"seed{s}" / "summary.json")["last"]["accuracy"] for s in (1, 2)]
        assert row["test_last"]["mean"] == pytest.approx(np.mean(finals))
        assert row["test_last"]["std"] == pytest.approx(np.std(finals))
    best = max(rows.values(), key=lambda r: r["val_mean_last_10"]["mean"])
    assert summary["best_by_validation"]["point"] == best["point"]
    assert "Best by validation" in (swept / "sweep.md").read_text()


def test_seeds_differ_and_no_validation_means_no_pick(tmp_path):
    out = tmp_path / "seeds"
    assert train.main(["--method", "fedavg", *TINY[:-1], "--rounds", "2", "--seeds", "0,3", "--out", str(out)]) == 0
    a, b = _metrics(out / "seed0"), _metrics(out / "seed3")
    assert a[-1]["accuracy"] != b[-1]["accuracy"]
    summary = _json(out / "sweep.json")
    assert summary["best_by_validation"] is None and "no point is picked" in summary["note"]


def test_a_value_the_method_branches_on_in_python_is_refused(tmp_path, capsys):
    # pFedKD skips its teacher when alpha == 0.0, a Python decision: alpha cannot be traced
    code = train.main(["--method", "pfedkd", *TINY, "--rounds", "1", "method.alpha=[0,0.5]",
                       "--out", str(tmp_path / "kd")])
    err = capsys.readouterr().err
    assert code == 2 and "one by one" in err and "Traceback" not in err


def test_chunks_follow_the_memory_guard_setting():
    cfg = config_lib.build(overrides=["train.max_experiments_per_call=2"])
    assert sweep.experiments_per_call(None, cfg, 5) == 2
    with pytest.raises(UserError, match="resume a point"):
        sweep.run_sweep(validate(config_lib.build(overrides=["seeds=[0,1]"])), resume=True)


def test_each_seed_with_its_own_partition_equals_its_single_run(tmp_path):
    """vary_data_with_seed: each seed's partition is its federation's data; each point equals the plain single
    run with that seed (data_seed = seed), with fixed client sizes and with ragged ones (largest clients
    differ between the seeds)."""
    args = ["--method", "fedavg", "--dataset", "fmnist", "--model", "mlr", "--num-clients", "4", "--partition",
            "dirichlet", "--alpha", "0.5", "--rounds", "2", "--local-epochs", "1", "--batch-size", "10",
            "partition.train_per_client=30", "partition.test_per_client=10", "--no-progress"]
    assert train.main([*args, "--seeds", "0,1", "vary_data_with_seed=true", "--out", str(tmp_path / "sw")]) == 0
    assert train.main([*args, "--seed", "1", "--out", str(tmp_path / "single")]) == 0
    point, single = tmp_path / "sw" / "seed1", tmp_path / "single"
    assert _json(point / "partition.json") == _json(single / "partition.json")
    assert _json(point / "partition.json") != _json(tmp_path / "sw" / "seed0" / "partition.json")
    np.testing.assert_allclose([r["loss"] for r in _metrics(point)], [r["loss"] for r in _metrics(single)], rtol=1e-5)
    assert train.main([*TINY, "--method", "fedavg", "--seeds", "0,1", "vary_data_with_seed=true",
                       "--out", str(tmp_path / "ragged")]) == 0
    assert train.main([*TINY, "--method", "fedavg", "--seed", "1", "--out", str(tmp_path / "ragged1")]) == 0
    point, single = tmp_path / "ragged" / "seed1", tmp_path / "ragged1"
    assert _json(point / "partition.json") == _json(single / "partition.json")
    assert _json(point / "partition.json") != _json(tmp_path / "ragged" / "seed0" / "partition.json")
    for key in ("accuracy", "loss", "train_loss"):
        np.testing.assert_allclose([r[key] for r in _metrics(point)], [r[key] for r in _metrics(single)], rtol=1e-5,
                                   atol=1e-6)



def _count_timings(monkeypatch) -> list:
    """The federations each timed round of a program covers, as the sweep times them (one candidate: vmap)."""
    monkeypatch.setattr(mapping_choice, "candidates", lambda clients, backend=None, packed_width=None: [("vmap", None)])
    timed, compiled = [], FederationRows.compiled_round
    monkeypatch.setattr(FederationRows, "compiled_round", lambda self, servers, *a: timed.append(
        jax.tree.leaves(servers)[0].shape[0]) or compiled(self, servers, *a))
    return timed


def test_auto_mapping_is_timed_on_the_sweeps_own_program_and_runs_it(tmp_path, monkeypatch):
    """train.client_mapping=auto: a sweep of 20 rounds or more times the candidates on its program's round (all
    points at once, as federations), runs every point with the winner and records it."""
    timed, used, run = _count_timings(monkeypatch), [], FederationRows.run_rounds
    monkeypatch.setattr(FederationRows, "run_rounds",
                        lambda self, *a, **k: used.append(str(self.mapping)) or run(self, *a, **k))
    args = [a if a != "3" else "20" for a in TINY]
    assert train.main(["--method", "fedavg", *args, "--seeds", "0,1", "--out", str(tmp_path / "sw")]) == 0
    assert timed == [2]  # once, on both seeds' stacked state
    assert used and set(used) == {"vmap"}
    for seed in (0, 1):
        record = _json(tmp_path / "sw" / f"seed{seed}" / "config.json")["resolved"]["train.client_mapping"]
        assert record["timed"] and record["chosen"] == "vmap" and "round_s" in record["candidates"]["vmap"]


def test_later_chunks_of_the_same_size_take_the_first_ones_timed_mapping(tmp_path, monkeypatch):
    """Chunks of equal size run the same program shape: only the first is timed, the others reuse its choice
    (recorded as reused); a smaller last chunk is timed on its own."""
    timed = _count_timings(monkeypatch)
    args = [a if a != "3" else "20" for a in TINY]
    assert train.main(["--method", "fedavg", *args, "--seeds", "0,1,2,3,4", "train.max_experiments_per_call=2",
                       "--out", str(tmp_path / "sw")]) == 0
    assert timed == [2, 1]
    records = [_json(tmp_path / "sw" / f"seed{s}" / "config.json")["resolved"]["train.client_mapping"]
               for s in range(5)]
    assert [r["chosen"] for r in records] == ["vmap"] * 5
    assert [("reused" in r) for r in records] == [False, False, True, True, False]
    assert records[2]["candidates"] == records[0]["candidates"]


def test_the_federations_round_equals_each_runs_own_round():
    """`FederationRows.compiled_round` (what a sweep times) computes each federation's `Engine.compiled_round`
    with its seed and lr (the second federation's lr a traced value)."""
    cfg = config_lib.build(overrides=["data.name=synthetic", "model.name=mlr", "partition.num_clients=6",
                                      "partition.scheme=natural", "train.batch_size=8", "train.local_epochs=1",
                                      "method_name=fedavg"])
    engine = build_experiment(validate(cfg)).engine
    pool, lrs = rows_of(engine, 2), [engine.method.setup.lr, 0.05]
    keys = jax.random.split(jax.random.key(3), 2)
    servers, clients = pool.init(keys)
    round_keys = jax.vmap(lambda k: engine_lib.round_keys(k, 4)[0])(keys)
    together = pool.compiled_round(servers, clients, round_keys, 4, {"lr": np.asarray(lrs, np.float32)})()
    for e in range(2):
        alone = engine.compiled_round(*pool.state(servers, clients, e), round_keys[e], 4, {"lr": lrs[e]})()
        for a, b in zip(jax.tree.leaves(alone[:2]), jax.tree.leaves(pool.state(*together[:2], e))):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(together[2]["groups"][0]["selected"][e], alone[2]["selected"])
