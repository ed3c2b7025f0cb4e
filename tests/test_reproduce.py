"""``python -m fedjax_pfl.reproduce``: paper tables as data, run cell by cell, resumable."""

import csv
import re
import json
import shlex
import shutil

import jax
import numpy as np
import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.commands import train
from fedjax_pfl.runs import config
from fedjax_pfl.outputs import report
from fedjax_pfl.cells import data_check, reproduce
from fedjax_pfl.papers import paper_table
from fedjax_pfl.cells import parallel_cells
from fedjax_pfl.papers import earlier_table, table_spec
from fedjax_pfl.outputs import machine, results_writer, run_folder
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


TABLES = {"diversifed_table1", "diversifed_table2", "fedas_table2", "fedas_table3", "fedas_table4", "fedpac_table1",
          "pfakd_table1", "pfakd_table2", "pfedkd_table1"}


def test_list_shows_every_table(capsys):
    assert reproduce.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert set(table_spec.table_names()) == TABLES
    for name in TABLES:
        assert f"| {name} |" in out
    assert "800, 600" in out  # pFedKD-WCL: MNIST 800 rounds, Synthetic 600
    assert "17 rows (16 with runs of their own) x 4 settings x 3 seeds" in out  # FedPAC: Replicate shows fedpac's


def _cifar100_missing() -> bool:
    return data_check.missing_data(config.build(None, ["data.name=cifar100"])) is not None


@pytest.mark.parametrize("name", sorted(TABLES))
def test_dry_run_lists_every_cell_with_a_valid_config(name, capsys, tmp_path):
    """One line per (row that runs, setting) with its training command; every cell's config validates (the
    dry run builds each); a setting whose dataset is missing says 'no data'. (An empty --out: the runs of
    reproductions/NAME, where a developer has some, would show as 'skipped (done)'.)"""
    spec = table_spec.find_table(name)
    assert reproduce.main([name, "--dry-run", "--seeds", "0", "--out", str(tmp_path / name)]) == 0
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    cells = spec.cells(seeds=[0])
    runs = {spec.run_row(m).name: spec.run_row(m) for m in spec.methods}.values()  # a row's settings, or all
    assert len(printed) == len(cells) == sum(len(m.settings or spec.settings) for m in runs)
    for line, cell in zip(printed, cells):
        assert f"/{len(cells)}] {cell.folder_name}: " in line
        assert f"--method {cell.method.method} --seed 0" in line and all(o in line for o in cell.overrides)
        no_data = "data.name=cifar100" in cell.overrides and _cifar100_missing()
        assert (f"{cell.folder_name}: no data: python -m fedjax_pfl.train" in line) == no_data, line


def test_pfedkd_table_sets_the_papers_baseline_options():
    spec = table_spec.find_table("pfedkd_table1")
    cells = {(c.method.name, c.setting.name): c for c in spec.cells(seeds=[0])}
    built = {k: reproduce.build_config(reproduce.base_argv(c)).config for k, c in cells.items()}
    assert built["fedprox", "mnist_mlr"].method["mu"] == 0.01
    assert built["perfedavg", "synthetic_mlp"].method["beta"] == 0.002
    assert built["pfedme", "mnist_mlr"].train.all_clients_train
    assert not built["pfedkd", "mnist_mlr"].train.all_clients_train
    lamdas = {s: built["pfedme", s].method["lamda"] for s in ("mnist_mlr", "mnist_mlp", "synthetic_mlr",
                                                              "synthetic_mlp")}
    assert lamdas == {"mnist_mlr": 15, "mnist_mlp": 15, "synthetic_mlr": 20, "synthetic_mlp": 30}
    assert built["pfedme", "synthetic_mlp"].method["personal_lr"] == 0.01  # 0.1 diverges at lambda 30
    assert (built["pfedkd", "mnist_mlr"].train.local_epochs, built["pfedkd", "mnist_mlr"].train.rounds) == (20, 800)
    assert built["pfedkd", "mnist_mlr"].partition.max_classes_per_client == 3
    step = {s: (built["pfedkd", s].method["server_kl"], built["pfedkd", s].method["server_weights"])
            for s in ("mnist_mlr", "synthetic_mlp", "mnist_mlr_text", "mnist_mlp_text")}
    assert step == {"mnist_mlr": ("teacher_first", "sample_size"), "synthetic_mlp": ("teacher_first", "sample_size"),
                    "mnist_mlr_text": ("student_first", "uniform"), "mnist_mlp_text": ("student_first", "uniform")}
    assert built["fedavg", "synthetic_mlp"].model.hidden == built["fedavg", "mnist_mlp"].model.hidden == (128,)
    assert built["fedavg", "synthetic_mlr"].train.rounds == 600
    assert spec.metric == "last" and spec.also_metrics == ("best",)


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
    assert "| method | synth ours | synth paper | synth Δ |" in text
    assert "Rounds: 2 of 4 (reduced)." in text and "Seeds: 0, 1 (reduced" in text
    local, diff = rows["local"], 100 * float(rows["local"]["mean"]) - 55.5
    assert float(local["diff"]) == pytest.approx(diff / 100) and local["flag"] == str(abs(diff) > 1.5)
    assert (f"| local | {100 * float(local['mean']):.2f} ± {100 * float(local['std']):.2f} (n=2) | 55.50 | "
            f"{diff:+.2f}{' ⚠' if abs(diff) > 1.5 else ''} |") in text
    global_row = [ln for ln in text.splitlines() if ln.startswith("| global | ")]
    assert len(global_row) == 1 and global_row[0].endswith("| - | - |")  # no paper number: no difference
    assert text.count("-synth/seed") == 4 and text.rstrip().splitlines()[-1].startswith("| global-synth/seed1 | 2 |")
    # 3) again: every cell is skipped, nothing is trained
    monkeypatch.setattr(train, "main", lambda argv=None, observe=None: pytest.fail("a finished cell ran again"))
    assert reproduce.main(argv) == 0
    assert capsys.readouterr().out.count("skipped (done)") == 4
    # 4) other rounds into the same folder: refused before any work
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--rounds", "3", "--seeds", "0"]) == 2
    assert "holds a run of another configuration" in _error_line(capsys)


def test_table_only_writes_the_finished_cells_and_trains_nothing(tmp_path, monkeypatch, capsys):
    table, out = _write_tiny(tmp_path), tmp_path / "repro"
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    argv = ["--table-file", str(table), "--out", str(out), "--rounds", "2", "--seeds", "0", "--no-progress"]
    assert reproduce.main([*argv, "--methods", "local"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(train, "main", lambda argv=None, observe=None: pytest.fail("--table-only trained a cell"))
    assert reproduce.main([*argv, "--table-only"]) == 0
    printed = capsys.readouterr().out
    assert "local-synth/seed0: skipped (done)" in printed
    assert "global-synth/seed0: not run (--table-only; new: python -m fedjax_pfl.train --method fedavg" in printed
    rows = {r["method"]: r for r in csv.DictReader(open(out / "table.csv"))}
    assert rows["local"]["status"] == "1 finished" and rows["global"]["status"] == "1 not run"
    assert rows["local"]["folders"] == "runs/local-synth/seed0"  # relative to table.csv, wherever it is moved
    text = (out / "table.md").read_text()
    assert "| local | " in text and "- (1 not run)" in text
    assert not (out / "runs" / "global-synth").exists()
    # the header names the command; the Runs section each run's rounds, minutes, status, commit, machine, jax
    assert f"Command: `python -m fedjax_pfl.reproduce --table-file {table} --out {out} --rounds 2 --seeds 0`." in text
    run = [ln for ln in text.splitlines() if ln.startswith("| local-synth/seed0 |")]
    assert len(run) == 1 and "## Runs" in text and "global-synth" not in text.split("## Runs")[1], text
    cells = [c.strip() for c in run[0].strip("|").split("|")]
    assert cells[1] == "2" and float(cells[2]) >= 0 and cells[3] == "finished", cells
    assert cells[5] == machine.describe() and cells[6] == jax.__version__, cells
    assert reproduce.main([*argv, "--table-only", "--dry-run"]) == 2
    assert "give one of them" in _error_line(capsys)


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
    (["pfedkd_table1", "--jobs", "0"], "--jobs must be a whole number from 1 to 256"),
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


def test_jobs_train_cells_side_by_side_with_the_numbers_of_one_after_another(tmp_path, monkeypatch, capsys):
    table = _write_tiny(tmp_path)
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: False)
    argv = ["--table-file", str(table), "--rounds", "2", "--seeds", "0", "--no-progress"]
    assert reproduce.main([*argv, "--out", str(tmp_path / "serial")]) == 0
    capsys.readouterr()
    monkeypatch.setattr(train, "main", lambda argv=None, observe=None: pytest.fail("a cell ran in this process"))
    assert reproduce.main([*argv, "--out", str(tmp_path / "jobs"), "--jobs", "3"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert sum(ln.startswith("started ") for ln in lines) == 2 and sum(ln.startswith("finished ") for ln in lines) == 2
    logs = sorted(p.name for p in (tmp_path / "jobs" / "logs").iterdir())
    assert logs == ["global-synth_seed0.log", "local-synth_seed0.log"]
    log = (tmp_path / "jobs" / "logs" / "local-synth_seed0.log").read_text()
    assert "3 clients" in log and "final accuracy" in log  # the cell's own output went to its log
    rows = {mode: {r["method"]: r for r in csv.DictReader(open(tmp_path / mode / "table.csv"))}
            for mode in ("serial", "jobs")}
    for method in ("local", "global"):
        assert rows["jobs"][method]["status"] == "1 finished"
        assert float(rows["jobs"][method]["mean"]) == pytest.approx(float(rows["serial"][method]["mean"]), abs=1e-5)
    assert "--jobs" not in (tmp_path / "jobs" / "table.md").read_text()  # the table's command: what chose the cells
    # cells that fail side by side are reported with their logs, exit 1
    monkeypatch.setattr(parallel_cells, "TRAIN_MODULE", "fedjax_pfl.no_such_module")
    assert reproduce.main([*argv, "--out", str(tmp_path / "bad"), "--jobs", "2"]) == 1
    captured = capsys.readouterr()
    assert sum(ln.startswith("failed ") for ln in captured.out.splitlines()) == 2
    assert "2 cell(s) failed" in captured.err


MISSING = """
paper: "Tiny paper"
table: "Table 0"
seeds: [0]
settings:
  - name: synth
    overrides: [data.name=synthetic, partition.scheme=natural, partition.num_clients=3, model.name=mlr,
                train.rounds=2]
  - {name: c100, overrides: [data.name=cifar100, partition.num_clients=3]}
methods: [fedavg]
"""


def test_a_missing_dataset_is_a_note_and_the_other_cells_run(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    monkeypatch.setenv("FEDJAX_PFL_DATA_DIR", str(empty))
    monkeypatch.setenv("FEDJAX_PFL_CACHE_DIR", str(empty))
    ran = []
    monkeypatch.setattr(train, "main", lambda argv, observe=None: ran.append(argv) or 0)
    table = tmp_path / "missing.yaml"
    table.write_text(MISSING)
    argv = ["--table-file", str(table), "--out", str(tmp_path / "r"), "--no-progress"]
    assert reproduce.main([*argv, "--dry-run"]) == 0
    assert "fedavg-c100/seed0: no data: python -m fedjax_pfl.train" in capsys.readouterr().out
    assert reproduce.main(argv) == 0  # documented: missing data does not change the exit status
    out, err = capsys.readouterr()
    assert len(ran) == 1 and "data.name=synthetic" in ran[0]  # only the cell with data ran
    assert err.strip().splitlines() == [
        "note: not run, dataset files missing (c100): Dataset file cifar-100-python.tar.gz (or its extracted "
        "folder cifar-100-python/) not found"]
    text = (tmp_path / "r" / "table.md").read_text()
    assert "| fedavg | - (1 not run) | - (1 no data) |" in text
    note = [ln for ln in text.splitlines() if ln.startswith("Not run, dataset files missing (c100)")]
    assert len(note) == 1 and "cifar-100-python.tar.gz" in note[0] and "--data-dir DIR" in note[0]



def test_a_missing_dataset_whose_cells_all_ran_is_no_note(tmp_path, monkeypatch, capsys):
    """Writing the table where the files are absent (a fresh clone) keeps finished cells and says nothing of
    missing data for a setting with nothing left to run."""
    empty = tmp_path / "nothing"
    empty.mkdir()
    monkeypatch.setenv("FEDJAX_PFL_DATA_DIR", str(empty))
    monkeypatch.setenv("FEDJAX_PFL_CACHE_DIR", str(empty))
    table = tmp_path / "missing.yaml"
    table.write_text(MISSING.replace("methods: [fedavg]", "methods: [fedavg]\npaper_results: {fedavg: [null, 50]}"))
    out = tmp_path / "r"
    argv = ["--table-file", str(table), "--out", str(out), "--no-progress", "--settings", "c100"]
    assert reproduce.main([*argv, "--dry-run"]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "no data: " in ln]
    cfg = reproduce.build_config(shlex.split(line.split("python -m fedjax_pfl.train ", 1)[1])).config
    folder = out / "runs" / "fedavg-c100" / "seed0"  # the run, made where the files were
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": config.to_dict(cfg)}))
    (folder / "summary.json").write_text(json.dumps({"status": "finished"}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(
        {"round": r, "accuracy": 0.5, "accuracy_weighted": 0.5, "accuracy_std": 0.0, "loss": 1.0, "seconds": r})
        + "\n" for r in range(1, cfg.train.rounds + 1)))
    assert reproduce.main([*argv, "--table-only"]) == 0
    assert "dataset files missing" not in capsys.readouterr().err
    text = (out / "table.md").read_text()
    assert "| fedavg | 50.00 ± 0.00 (n=1) | 50.00 | +0.00 |" in text and "dataset files missing" not in text


def _fake_run(folder, seed: int, accuracies: list[float], weighted: list[float] | None = None) -> None:
    """A finished run folder as the training command leaves it, with the given accuracy per round
    (and sample-weighted accuracy: ``weighted``, else the same)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"seed": seed}}))
    (folder / "summary.json").write_text(json.dumps({"status": "finished"}))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"round": r, "accuracy": a, "accuracy_weighted": w, "accuracy_std": 0.0, "loss": 1.0,
                    "seconds": r}) + "\n"
        for r, (a, w) in enumerate(zip(accuracies, weighted or accuracies), 1)))


FLAGS = """
paper: "Tiny paper"
table: "Table 0"
metric: last
also_metrics: [best]
seeds: [0, 1]
settings: [{name: s}]
methods:
  - local
  - {name: global, label: "global (paper)", method: fedavg}
  - {name: global_rerun, label: "global (rerun)", runs_of: global}
paper_results: {local: {s: "79.50 +- 1.00"}, global: [90], global_rerun: [70.5]}
notes: "A note of the table file."
"""


def test_ours_paper_difference_and_flag_of_finished_cells(tmp_path):
    table = tmp_path / "flags.yaml"
    table.write_text(FLAGS)
    spec = table_spec.load_table(table)
    runs = tmp_path / "runs"
    _fake_run(runs / "local-s" / "seed0", 0, [0.90, 0.80])
    _fake_run(runs / "local-s" / "seed1", 1, [0.82, 0.82])
    _fake_run(runs / "global-s" / "seed0", 0, [0.70, 0.70])
    _fake_run(runs / "global-s" / "seed1", 1, [0.75, 0.70])
    text = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1])
    assert "| method | s ours | s paper | s Δ |" in text
    assert "| local | 81.00 ± 1.00 (n=2) | 79.50 ± 1.00 | +1.50 |" in text  # exactly 1.5 apart: not flagged
    assert "| global (paper) | 70.00 ± 0.00 (n=2) | 90.00 | -20.00 ⚠ |" in text
    assert "| global (rerun) | 70.00 ± 0.00 (n=2) | 70.50 | -0.50 |" in text  # the same runs, its own number
    assert "| local | 86.00 ± 4.00 (n=2) |" in text.split("## Also: ")[1]  # best round, no paper column
    assert "## Notes\n\nA note of the table file.\n\n## Runs\n" in text
    # a run whose config.json records no versions: '-' for commit, machine and jax
    assert text.rstrip().endswith("| global-s/seed1 | 2 | 0.0 | finished | - | - | - |")
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "table.csv"))}
    assert float(rows["global"]["diff"]) == pytest.approx(-0.2) and rows["global"]["flag"] == "True"
    assert float(rows["local"]["paper_std"]) == pytest.approx(0.01) and rows["local"]["flag"] == "False"
    assert rows["global_rerun"]["folders"] == rows["global"]["folders"]
    assert float(rows["local"]["best_mean"]) == pytest.approx(0.86)


def test_a_weighted_metric_reads_the_accuracy_pooled_over_the_test_samples(tmp_path):
    """metric: mean_last_10_weighted (PFLlib's sum correct / sum samples); the unweighted beside it."""
    table = tmp_path / "weighted.yaml"
    table.write_text(FLAGS.replace("metric: last\nalso_metrics: [best]",
                                  "metric: mean_last_10_weighted\nalso_metrics: [mean_last_10]"))
    spec = table_spec.load_table(table)
    for row in ("local", "global"):
        for seed in (0, 1):
            _fake_run(tmp_path / "runs" / f"{row}-s" / f"seed{seed}", seed, [0.5, 0.7], weighted=[0.6, 0.9])
    text = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1])
    assert "of the test samples pooled over clients" in text and "unweighted mean over clients" not in text
    assert "| local | 75.00 ± 0.00 (n=2) | 79.50 ± 1.00 | -4.50 ⚠ |" in text  # mean of 0.6 and 0.9
    assert "| local | 60.00 ± 0.00 (n=2) |" in text.split("## Also: ")[1]  # mean of 0.5 and 0.7


GRID = """
paper: P
table: T
grid:
  overrides: [data.name=synthetic]
  axes:
    - {name: beta, key: partition.alpha, values: [0.1, 0.5]}
    - {name: P, key: train.join_ratio, values: [0.2, 1]}
methods: [fedavg, {name: copy, runs_of: fedavg}]
paper_results: {fedavg: [1, null, 3, 4], copy: {beta0.5_P1: "5 +- 0.5"}}
"""


def test_a_grid_spans_the_product_of_its_axes(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(GRID)
    spec = table_spec.load_table(path)
    assert [(s.name, s.group, s.column) for s in spec.settings] == [
        ("beta0.1_P0.2", "beta0.1", "P0.2"), ("beta0.1_P1", "beta0.1", "P1"),
        ("beta0.5_P0.2", "beta0.5", "P0.2"), ("beta0.5_P1", "beta0.5", "P1")]
    assert spec.settings[1].overrides == ("data.name=synthetic", "partition.alpha=0.1", "train.join_ratio=1")
    assert {c.method.name for c in spec.cells()} == {"fedavg"} and len(spec.cells(methods=["copy"])) == 4
    assert spec.paper_value("fedavg", "beta0.1_P1") is None and spec.paper_value("fedavg", "beta0.5_P1").mean == 4
    assert spec.paper_value("copy", "beta0.5_P1").std == 0.5


@pytest.mark.parametrize("change, message", [
    (("[1, null, 3, 4]", "[1, 3]"), "lists 2 values for 4 settings"),
    (("[1, null, 3, 4]", "[1, null, 3, 140]"), "must be a percentage from 0 to 100"),
    (('"5 +- 0.5"', '"5 pm 0.5"'), "must be a percentage from 0 to 100"),
    (("runs_of: fedavg", "runs_of: copy"), "runs_of of copy must name a row that runs"),
    (("{name: copy, runs_of: fedavg}", "{name: copy, runs_of: fedavg, overrides: [a.b=1]}"),
     "give it only name, label, runs_of"),
    (("values: [0.2, 1]", "values: []"), "needs key (a dotted config key) and values"),
    (("paper: P", "paper: P\nsettings: [{name: x}]"), "give either settings (a list) or grid"),
    (("paper: P", "paper: P\nnotse: x"), "unknown key(s) notse"),
])
def test_bad_table_schema_is_one_line(tmp_path, change, message):
    path = tmp_path / "bad.yaml"
    assert change[0] in GRID
    path.write_text(GRID.replace(*change))
    with pytest.raises(table_spec.UserError, match=re.escape(message)):
        table_spec.load_table(path)


def test_provenance_of_a_resumed_run_names_every_segment(tmp_path):
    """config.json's versions and each resumed segment's: distinct commits (short), machines and jax
    versions in order; '-' where a segment records none."""
    first = {"git_commit": "a" * 40, "jax": "0.10.2"}
    second = {"git_commit": "b" * 40, "jax": "0.10.2", "machine": "cpu: X x2"}
    (tmp_path / "config.json").write_text(json.dumps(
        {"config": {}, "versions": first, "resumed": [{"after_round": 5, "versions": second},
                                                      {"after_round": 9, "versions": second}]}))
    assert run_folder.read_provenance(tmp_path) == {"commits": ["aaaaaaa", "bbbbbbb"], "machines": ["-", "cpu: X x2"],
                                                    "jax": ["0.10.2"]}


def test_rewriting_a_table_where_some_run_folders_are_absent_keeps_their_cells(tmp_path):
    """A fresh clone holds table.md/csv but no runs/: writing the table again keeps the absent cells' results
    and Runs lines (the paper's number and difference recomputed from the table file) and the hand-written
    preface; cells of other rounds are not kept."""
    table = tmp_path / "flags.yaml"
    table.write_text(FLAGS)
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _fake_run(runs / "local-s" / f"seed{seed}", seed, [0.90, 0.80 + 0.02 * seed])
        _fake_run(runs / "global-s" / f"seed{seed}", seed, [0.70, 0.70 + 0.01 * seed])
    spec = table_spec.load_table(table)
    first = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1]).splitlines()
    preface = ["Run by hand on two machines;", "see below."]
    (tmp_path / "table.md").write_text("\n".join([first[0], "", *preface, "", *first[1:]]) + "\n")
    shutil.rmtree(runs / "global-s")
    table.write_text(FLAGS.replace("global: [90]", "global: [71]"))
    spec = table_spec.load_table(table)
    text = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1])
    lines = text.splitlines()
    assert lines[:5] == [first[0], "", *preface, ""]
    assert "| global (paper) | 70.50 ± 0.50 (n=2) | 71.00 | -0.50 |" in lines
    assert "| global (rerun) | 70.50 ± 0.50 (n=2) | 70.50 | +0.00 |" in lines
    assert "| local | 81.00 ± 1.00 (n=2) | 79.50 ± 1.00 | +1.50 |" in lines
    assert ("Kept from the table written here before (2 runs whose folders are not here, their results and Runs "
            "lines as that table gives them): global-s/seed0, global-s/seed1.") in lines
    for run in ("global-s/seed0", "global-s/seed1"):
        assert [ln for ln in lines if ln.startswith(f"| {run} |")] == [ln for ln in first if ln.startswith(f"| {run} |")]
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "table.csv"))}
    assert float(rows["global"]["mean"]) == pytest.approx(0.705) and rows["global"]["runs"] == "2"
    assert float(rows["global"]["diff"]) == pytest.approx(-0.005) and rows["global"]["flag"] == "False"
    assert float(rows["global"]["best_mean"]) == pytest.approx(0.705)
    assert rows["global"]["folders"] == "runs/global-s/seed0;runs/global-s/seed1"
    # written again: the same text (the kept cells stay kept)
    assert paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1]) == text
    # a third seed asked for: the kept cell says it was not run
    folder = tmp_path / "three"
    shutil.copytree(runs / "local-s", folder / "runs" / "local-s")
    for name in ("table.md", "table.csv"):
        shutil.copy(tmp_path / name, folder / name)
    three = paper_table.write_table(spec, spec.cells(seeds=[0, 1, 2]), folder, {"s": (2, 2)}, [0, 1, 2])
    assert "| global (paper) | 70.50 ± 0.50 (n=2) (2 finished, 1 not run) | 71.00 | -0.50 |" in three
    assert "(2 runs whose folders are not here" in three
    # written again with the third seed still asked for: the kept cell stays kept (not dropped as unfinished)
    assert paper_table.write_table(spec, spec.cells(seeds=[0, 1, 2]), folder, {"s": (2, 2)}, [0, 1, 2]) == three
    # other rounds: the earlier line does not stand for the cell
    other = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (3, 3)}, [0, 1])
    assert "| global (paper) | - (2 not run) | 71.00 | - |" in other and "Kept from" not in other


def test_a_seed_only_the_earlier_table_holds_is_pooled_with_the_cells_run_folders_here(tmp_path):
    """Seed 0 of a cell ran elsewhere (only table.csv holds it) and seed 1 has a run folder here: the cell pools
    both (seed 0's value from table.csv's values columns), keeps seed 0's Runs line and adds seed 1's; the
    result equals the table written with both folders here. The pooled line is taken apart run by run when
    the table is written again; a line whose values columns are empty cannot be, and is a one-line error."""
    table = tmp_path / "flags.yaml"
    table.write_text(FLAGS)
    spec = table_spec.load_table(table)
    for row in ("local", "global"):
        _fake_run(tmp_path / "runs" / f"{row}-s" / "seed0", 0, [0.9, 0.7])
    paper_table.write_table(spec, spec.cells(seeds=[0]), tmp_path, {"s": (2, 2)}, [0])
    first = (tmp_path / "table.md").read_text().splitlines()
    shutil.move(tmp_path / "runs" / "global-s" / "seed0", tmp_path / "elsewhere")
    _fake_run(tmp_path / "runs" / "global-s" / "seed1", 1, [0.95, 0.8])
    text = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1])
    assert "| global (paper) | 75.00 ± 5.00 (n=2) | 90.00 | -15.00 ⚠ |" in text
    assert "| local | 90.00 ± 0.00 (n=1) (1 finished, 1 not run) |" in text
    assert [ln for ln in text.splitlines() if ln.startswith("| global-s/seed0 |")] == [
        ln for ln in first if ln.startswith("| global-s/seed0 |")]
    assert any(ln.startswith("| global-s/seed1 | 2 |") for ln in text.splitlines())
    assert "(1 runs whose folders are not here, their results and Runs lines as that table gives them): " \
        "global-s/seed0." in text
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "table.csv"))}
    assert rows["global"]["seeds"] == "0, 1" and rows["global"]["status"] == "2 finished"
    assert rows["global"]["folders"] == "runs/global-s/seed0;runs/global-s/seed1"
    assert float(rows["global"]["std"]) == pytest.approx(0.05)
    assert float(rows["global"]["best_mean"]) == pytest.approx(0.925) and float(rows["global"]["best_std"]) == pytest.approx(0.025)
    assert rows["global"]["values"] == "0.7;0.8" and rows["global"]["best_values"] == "0.9;0.95"
    # written again (the line now holds both seeds, seed 1's folder here): seed 0 taken from it run by run
    assert paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1]) == text
    shutil.move(tmp_path / "elsewhere", tmp_path / "runs" / "global-s" / "seed0")
    both = paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1])
    assert both == text.replace("\n" + next(ln for ln in text.splitlines() if ln.startswith("Kept from")), "")
    # a line of two runs with empty values columns cannot be taken apart: a one-line error
    lines = list(csv.DictReader(open(tmp_path / "table.csv")))
    for line in lines:
        line["values"] = line["best_values"] = ""
    report.write_csv(tmp_path / "table.csv", lines)
    shutil.move(tmp_path / "runs" / "global-s" / "seed0", tmp_path / "elsewhere")
    with pytest.raises(UserError, match=r"global/s: the earlier table holds seeds whose folders \(runs/global-s/seed0\)"):
        paper_table.write_table(spec, spec.cells(), tmp_path, {"s": (2, 2)}, [0, 1])


@pytest.mark.parametrize("change", [{"status": "1 finished, 1 interrupted"}, {"rounds": "3"}, {"metric": "best"},
                                    {"seeds": "0, 5"}, {"runs": "0"}])
def test_an_earlier_line_stands_for_a_cell_only_when_it_matches(change):
    line = {"runs": "2", "mean": "0.5", "std": "0.1", "seeds": "0, 1", "rounds": "2", "status": "2 finished",
            "folders": "runs/a/seed0;runs/a/seed1", "metric": "last", "best_mean": "0.6", "best_std": "0.0"}
    kept = earlier_table.kept_ours(line, "last", 2, [0, 1, 2], ["best"])
    assert kept["runs"] == 2 and kept["mean"] == 0.5 and kept["best_mean"] == 0.6 and kept["seeds"] == "0, 1"
    # seeds that line did not run, written "not run" beside its finished ones, do not unmake it
    assert earlier_table.kept_ours({**line, "status": "2 finished, 1 not run"}, "last", 2, [0, 1, 2]) == {
        k: v for k, v in kept.items() if not k.startswith("best") and k != "values"} | {"values": None}
    assert earlier_table.kept_ours({**line, **change}, "last", 2, [0, 1, 2], ["best"]) is None
