"""``python -m fedjax_pfl.reproduce``: paper tables as data, run cell by cell, resumable."""

import csv
import json

import numpy as np
import pytest

from fedjax_pfl.runs import cli as train, reproduce
from fedjax_pfl.runs import results_writer, table_spec
from signal_after_round import signal_after

TINY = """
paper: "Tiny paper"
table: "Table 0"
metric: best
seeds: [0, 1, 2]
settings:
  - name: synth
    overrides: [data.name=synthetic, partition.scheme=natural, partition.num_clients=3, model.name=mlr,
                train.rounds=4, train.local_epochs=1, train.batch_size=16, train.join_ratio=1.0,
                train.rounds_per_call=1]
methods:
  - local
  - {name: global, method: fedavg}
paper_results: {local: {synth: 55.5}}
"""


def _write_tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_list_shows_every_table(capsys):
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    names = table_spec.table_names()
    assert {"diversifed_table1_fmnist", "pfedkd_table1", "pfakd_table1_fmnist", "fedpac_table1", "fedas_table2",
            "fedas_table3"} <= set(names)
    for name in names:
        assert f"| {name} |" in out
    assert "800, 600" in out  # pFedKD-WCL: MNIST 800 rounds, Synthetic 600


def test_every_cell_of_every_table_builds_a_valid_config(tmp_path):
    count = 0
    for name in table_spec.table_names():
        spec = table_spec.find_table(name)
        for cell in spec.cells(seeds=[0]):
            cfg = reproduce.build_config(reproduce.cell_argv(cell, tmp_path / cell.folder_name, 2))
            assert cfg.method_name == cell.method.method and cfg.train.rounds == 2
            count += 1
    assert count > 100


def test_pfedkd_table_sets_the_papers_baseline_options():
    spec = table_spec.find_table("pfedkd_table1")
    cells = {c.method.name: c for c in spec.cells(settings=["mnist_mlr"], seeds=[0])}
    built = {m: reproduce.build_config(reproduce.base_argv(c)) for m, c in cells.items()}
    assert built["fedprox"].method["mu"] == 0.01 and built["perfedavg"].method["beta"] == 0.002
    assert built["pfedme"].train.all_clients_train and not built["pfedkd"].train.all_clients_train
    assert built["pfedkd"].train.local_epochs == 20 and built["pfedkd"].train.rounds == 800
    assert built["pfedkd"].partition.max_classes_per_client == 3


def test_tiny_table_end_to_end_resumes_and_skips(tmp_path, monkeypatch, capsys):
    table, out = _write_tiny(tmp_path), tmp_path / "repro"
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)  # figures: ~1 s a run, not tested here
    argv = ["--table-file", str(table), "--out", str(out), "--rounds", "2", "--seeds", "0,1", "--no-progress"]
    # 1) Ctrl-C in the first cell (after its round 0): it stops with a checkpoint, the table holds what ran
    assert reproduce.main(argv, observe=signal_after(1, "INT")) == 130
    first = out / "runs" / "local-synth/seed0"
    assert json.loads((first / "summary.json").read_text())["status"] == "interrupted"
    assert "1 interrupted" in (out / "table.md").read_text()
    capsys.readouterr()
    # 2) the same command continues that cell with --resume and runs the other three
    assert reproduce.main(argv) == 0
    printed = capsys.readouterr().out
    assert "local-synth/seed0: resume: python -m fedjax_pfl.train" in printed and "--resume" in printed
    assert "global-synth/seed1: new: python -m fedjax_pfl.train --method fedavg --seed 1" in printed
    rows = {r["method"]: r for r in csv.DictReader(open(out / "table.csv"))}
    for method in ("local", "global"):
        best = [json.loads((out / "runs" / f"{method}-synth" / f"seed{k}" / "summary.json").read_text())
                ["best_optimistic"]["by_accuracy"]["accuracy"] for k in (0, 1)]
        assert float(rows[method]["mean"]) == pytest.approx(np.mean(best), abs=1e-12)
        assert float(rows[method]["std"]) == pytest.approx(np.std(best), abs=1e-12)
        assert rows[method]["status"] == "2 finished" and rows[method]["rounds"] == "2"
    text = (out / "table.md").read_text()
    assert "| method | synth paper | synth fedjax_pfl |" in text and "| local | 55.50 |" in text
    assert "synth: 2 of 4 (reduced)" in text and "Seeds: 0, 1 (reduced" in text
    local = rows["local"]
    assert f"{100 * float(local['mean']):.2f} ± {100 * float(local['std']):.2f}" in text
    # 3) again: every cell is skipped, nothing is trained
    monkeypatch.setattr(train, "main", lambda argv=None, observe=None: pytest.fail("a finished cell ran again"))
    assert reproduce.main(argv) == 0
    assert capsys.readouterr().out.count("skipped (done)") == 4
    # 4) other rounds into the same folder: refused before any work
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--rounds", "3", "--seeds", "0"]) == 2
    assert "holds a run of another configuration" in _error_line(capsys)


def test_a_failing_cell_does_not_stop_the_others(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_main(argv, observe=None):
        calls.append(argv[argv.index("--method") + 1])
        if len(calls) == 1:
            raise RuntimeError("a bug in one method")
        return 2 if len(calls) == 2 else 0

    monkeypatch.setattr(train, "main", fake_main)
    argv = ["--table-file", str(_write_tiny(tmp_path)), "--out", str(tmp_path / "r"), "--seeds", "0,1"]
    assert reproduce.main(argv) == 1
    assert calls == ["local", "local", "fedavg", "fedavg"]
    err = capsys.readouterr().err
    assert "RuntimeError: a bug in one method" in err
    assert "2 cell(s) failed: local-synth/seed0, local-synth/seed1" in err
    assert "- (2 not run)" in (tmp_path / "r" / "table.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["no_such_table"], "unknown table 'no_such_table'"),
    (["pfedkd_table1", "--methods", "fedavg,nope"], "unknown method(s) nope"),
    (["pfedkd_table1", "--seeds", "a"], "--seeds takes comma-separated whole numbers"),
    (["pfedkd_table1", "--rounds", "0"], "--rounds must be a whole number from 1"),
    ([], "name a table"),
    (["pfedkd_table1", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_exit_2(args, message, capsys):
    assert reproduce.main(args) == 2
    assert message in _error_line(capsys)


def test_bad_table_file_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(TINY.replace("paper_results: {local: {synth: 55.5}}", "paper_results: {nope: {synth: 1}}"))
    assert reproduce.main(["--table-file", str(path), "--dry-run"]) == 2
    assert "paper_results must map method names" in _error_line(capsys)


FIXED_SIZES = """
paper: "Tiny paper"
table: "Table 0"
metric: last
seeds: [0, 1]
settings:
  - name: fixed
    overrides: [data.name=synthetic, partition.scheme=iid, partition.num_clients=3, partition.train_per_client=20,
                partition.test_per_client=10, model.name=mlr, train.rounds=2, train.local_epochs=1,
                train.batch_size=8, train.join_ratio=1.0]
methods: [fedavg]
"""


def test_seeds_of_a_fixed_size_setting_run_as_one_program_and_equal_one_by_one(tmp_path, monkeypatch, capsys):
    table = tmp_path / "fixed.yaml"
    table.write_text(FIXED_SIZES)
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    tables = {}
    for mode in ("together", "one_by_one"):
        argv = ["--table-file", str(table), "--out", str(tmp_path / mode), "--no-progress"]
        assert reproduce.main([*argv, *(["--one-by-one"] if mode == "one_by_one" else [])]) == 0
        printed = capsys.readouterr().out
        assert ("fedavg-fixed seeds 0,1 (one program): new" in printed) == (mode == "together")
        tables[mode] = {r["method"]: r for r in csv.DictReader(open(tmp_path / mode / "table.csv"))}
        assert tables[mode]["fedavg"]["status"] == "2 finished"
    assert float(tables["together"]["fedavg"]["mean"]) == pytest.approx(float(tables["one_by_one"]["fedavg"]["mean"]),
                                                                         abs=1e-5)
    assert reproduce.main(["--table-file", str(table), "--out", str(tmp_path / "together"), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("skipped (done)") == 2
