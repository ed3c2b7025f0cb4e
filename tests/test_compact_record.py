"""Compact records (outputs/compact_record.py, ``reproduce --compact``): a stopped run kept as config.json,
summary.json and metrics.jsonl.xz gives the same table and report, counts as finished, is never resumed,
and a run that can still be resumed is never compacted."""

import json
import lzma
import shutil

import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import compact_record, figures, metrics_file, run_folder
from fedjax_pfl.cells import reproduce
from fedjax_pfl.commands import train
from fedjax_pfl.outputs import report

TABLE = """
paper: "Tiny paper"
table: "Table 0"
metric: mean_last_10
also_metrics: [best_weighted]
seeds: [0, 1]
settings:
  - name: synth
    overrides: [data.name=synthetic, partition.scheme=natural, partition.num_clients=3, model.name=mlr,
                train.rounds=3, train.local_epochs=1, train.batch_size=16, train.join_ratio=1.0]
methods: [local]
"""
RECORD = {"config.json", "summary.json", metrics_file.COMPACT}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny table reproduced for real: two finished cells, each with metrics.jsonl, csv files and a checkpoint."""
    root = tmp_path_factory.mktemp("compact")
    (root / "tiny.yaml").write_text(TABLE)
    assert reproduce.main(["--table-file", str(root / "tiny.yaml"), "--out", str(root / "out"), "--no-progress"]) == 0
    return root


def _files(run) -> set[str]:
    return {p.name for p in run.iterdir() if p.is_file()}


def test_a_compacted_table_reads_the_same_and_its_cells_count_as_finished(trained, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(trained / "out", out)
    runs = [out / "runs" / "local-synth" / f"seed{s}" for s in (0, 1)]
    full = [run_folder.read_records(r) for r in runs]
    assert {"metrics.jsonl", "partition.json", "clients.csv", "metrics.csv"} <= _files(runs[0])
    argv = ["--table-file", str(trained / "tiny.yaml"), "--out", str(out), "--no-progress"]
    assert reproduce.main([*argv, "--table-only"]) == 0  # the table as the full run folders give it here
    table = {n: (out / n).read_text() for n in ("table.md", "table.csv")}
    before = report.report([out / "runs"], tmp_path / "before")
    capsys.readouterr()

    assert reproduce.main([*argv, "--compact"]) == 0
    assert f"compacted 2 run folder(s) under {out} (0 compact already; 0 left whole" in capsys.readouterr().out
    for run, records in zip(runs, full):
        assert _files(run) == RECORD and (run / "checkpoint").is_dir()  # not a record: left as it is
        assert run_folder.read_records(run) == [{k: r[k] for k in metrics_file.COMPACT_KEYS} for r in records]
    assert {n: (out / n).read_text() for n in table} == table
    assert report.report([out / "runs"], tmp_path / "after") == before
    assert (tmp_path / "after" / "report.csv").read_text() == (tmp_path / "before" / "report.csv").read_text()

    assert reproduce.main(argv) == 0  # a plain rerun: both cells done, nothing trains
    printed = capsys.readouterr().out
    assert printed.count("skipped (done)") == 2 and all(_files(r) == RECORD for r in runs)
    assert reproduce.main([*argv, "--compact"]) == 0
    assert f"compacted 0 run folder(s) under {out} (2 compact already; 0 left whole" in capsys.readouterr().out

    assert train.main(["--resume", "--out", str(runs[0]), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a compact record of a stopped run" in err[0] and "cannot be resumed" in err[0]


def _fake_run(folder, status, records):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"seed": 0}}))
    (folder / "partition.json").write_text("{}")
    (folder / "metrics.jsonl").write_text("".join(metrics_file.line(r) for r in records))
    if status:
        (folder / "summary.json").write_text(json.dumps({"status": status}))
    return folder


RECORDS = [{"round": 1, "accuracy": 0.1 + 2e-17, "accuracy_weighted": 1 / 3, "accuracy_std": 0.5, "loss": 2.0,
            "train_loss": 2.5, "eval_model": "local", "seconds": 12.345678901234567},
           {"round": 2, "accuracy": float("nan"), "accuracy_weighted": 0.98765432109876543, "accuracy_std": 0.25,
            "loss": 1.5, "train_loss": 1.25, "eval_model": "local", "seconds": 23.456789012345678}]


def test_only_a_run_that_stopped_for_good_is_compacted_and_its_numbers_read_back_exactly(tmp_path):
    runs = {status or "unfinished": _fake_run(tmp_path / (status or "unfinished"), status, RECORDS)
            for status in ("finished", "failed", "interrupted", None)}
    (tmp_path / "data" / "config.json").parent.mkdir()
    (tmp_path / "data" / "config.json").write_text('{"num_clients": 3}')  # not a run's config.json
    found = compact_record.compact_runs(tmp_path)
    assert found == {"compacted": [runs["failed"], runs["finished"]], "already": [],
                     "whole": [runs["interrupted"], runs["unfinished"]]}
    for status in ("interrupted", "unfinished"):  # resumable: untouched
        assert _files(runs[status]) >= {"metrics.jsonl", "partition.json"} and not compact_record.is_compact(runs[status])
    kept = run_folder.read_records(runs["finished"])
    assert metrics_file.compact_lines(kept) == metrics_file.compact_lines(RECORDS)  # NaN and every digit as written
    assert kept[0]["accuracy"] == RECORDS[0]["accuracy"] and kept[1]["seconds"] == RECORDS[1]["seconds"]
    assert run_folder.wall_seconds(kept) == RECORDS[1]["seconds"]
    assert compact_record.compact_runs(tmp_path)["already"] == [runs["failed"], runs["finished"]]
    drawn = figures.draw_run(tmp_path / "plots", kept, None, None)  # no loss series: no loss figure
    assert [p.name for p in drawn] == ["accuracy.png"]


def test_a_sweep_record_keeps_the_validation_accuracy_and_diagnostics_it_was_picked_by(tmp_path):
    with_val = [{**r, "val_accuracy": 0.5 + i / 7, "val_loss": 1.0, "diagnostics": {"self_weight": 0.25}}
                for i, r in enumerate(RECORDS)]
    run = _fake_run(tmp_path / "point", "finished", with_val)
    compact_record.compact_run(run)
    kept = run_folder.read_records(run)
    assert [r["val_accuracy"] for r in kept] == [r["val_accuracy"] for r in with_val]
    assert [r["diagnostics"] for r in kept] == [r["diagnostics"] for r in with_val]
    assert all("val_loss" not in r and "loss" not in r for r in kept)


def test_a_damaged_record_is_never_compacted_and_a_damaged_compact_file_is_one_line(tmp_path):
    run = _fake_run(tmp_path / "torn", "finished", RECORDS)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"round": 3, "accur')
    with pytest.raises(UserError, match=r"line 3 is not a metrics record .*before compacting"):
        compact_record.compact_run(run)
    assert _files(run) == {"config.json", "summary.json", "partition.json", "metrics.jsonl"}
    compact = tmp_path / metrics_file.COMPACT
    compact.write_bytes(lzma.compress(b'{"round": 1}\n')[:-8])
    with pytest.raises(UserError, match="is damaged .not a whole xz stream"):
        metrics_file.read_metrics(compact)


def test_compact_with_dry_run_is_one_line(tmp_path, capsys):
    (tmp_path / "tiny.yaml").write_text(TABLE)
    assert reproduce.main(["--table-file", str(tmp_path / "tiny.yaml"), "--dry-run", "--compact"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dry-run writes nothing, --table-only and --compact write the table" in err[0]
