"""Results people look at: CSV tables, figures, TensorBoard scalars, the report across runs."""

import csv
import json
import math
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.commands import train
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import figures, metrics_file, run_folder
from fedjax_pfl.outputs import report
from fedjax_pfl.commands import report as report_command
from fedjax_pfl.outputs.results_writer import ResultsWriter

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _tiny_cfg(out, method="fedavg", **extra):
    """6 synthetic clients, logistic regression, 3 rounds: compiles in seconds."""
    return config_lib.build(overrides=[
        f"method_name={method}", "data.name=synthetic", "model.name=mlr", "partition.scheme=natural",
        "partition.num_clients=6", "train.rounds=3", "train.local_epochs=1", "train.batch_size=32",
        "train.lr=0.05", f"out={out}", *[f"{k}={v}" for k, v in extra.items()]])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("results") / "run"
    # FedAMP: a method that reports diagnostics (Method.round_diagnostics), so they pass through every file
    summary = train.run(_tiny_cfg(out, "fedamp", checkpoint_every=2, **{"log.tensorboard": "true"}), progress=False)
    assert summary["status"] == "finished"
    return out


def _assert_png(path, min_bytes=10_000):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > min_bytes, (path, len(data))
    with Image.open(path) as image:
        assert image.width >= 500 and image.height >= 300, (path, image.size)


def test_metrics_csv_equals_metrics_jsonl(run_dir):
    records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["round"] for r in records] == [1, 2, 3]
    assert len(rows) == len(records)
    assert all("diagnostics/self_weight" in row for row in rows)  # the method's diagnostics as columns
    for row, record in zip(rows, records):
        record = metrics_file.flat_record(record)
        assert list(row) == list(record)
        assert {k: (v if isinstance(record[k], str) else float(v)) for k, v in row.items()} == record  # exact


def test_clients_csv_is_the_final_per_client_evaluation(run_dir):
    partition = json.loads((run_dir / "partition.json").read_text())
    last = run_folder.read_records(run_dir)[-1]
    clients = run_folder.read_clients(run_dir)
    assert [c["client"] for c in clients] == list(range(6))
    assert [c["train_size"] for c in clients] == partition["train"]["sizes"]
    assert [c["test_size"] for c in clients] == partition["test"]["sizes"]
    acc = np.array([c["accuracy"] for c in clients])
    n_test = np.array([c["test_size"] for c in clients])
    loss = np.array([c["loss"] for c in clients])
    assert np.all((acc >= 0) & (acc <= 1)) and np.all(loss > 0)
    # the summary numbers of the last metrics line, recomputed from the per-client rows
    np.testing.assert_allclose(acc.mean(), last["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(acc.std(), last["accuracy_std"], rtol=1e-5)
    np.testing.assert_allclose((acc * n_test).sum() / n_test.sum(), last["accuracy_weighted"], rtol=1e-6)
    np.testing.assert_allclose((loss * n_test).sum() / n_test.sum(), last["loss"], rtol=1e-5)


def test_run_writes_its_figures_as_pngs(run_dir):
    for name in (*figures.RUN_FIGURES, figures.DIAGNOSTICS_FIGURE):
        _assert_png(run_dir / "plots" / name)


def _read_tensorboard_scalars(folder):
    """{tag: {step: value}} from TFRecord-framed Event protos (length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = value.simple_value
    return scalars


def test_tensorboard_events_hold_the_metrics(run_dir):
    scalars = _read_tensorboard_scalars(run_dir)
    records = [metrics_file.flat_record(r) for r in run_folder.read_records(run_dir)]
    numeric = {k for k, v in records[0].items() if not isinstance(v, str)}
    assert "diagnostics/self_weight" in numeric
    assert set(scalars) == numeric - {"round"}
    for tag, by_step in scalars.items():
        assert by_step == {r["round"]: float(np.float32(r[tag])) for r in records}, tag


def test_tensorboard_asked_for_but_missing_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(UserError, match=r"pip install 'fedjax_pfl\[tensorboard\]'"):
        ResultsWriter(tmp_path, tensorboard=True)


def test_run_without_matplotlib_finishes_with_tables_and_a_note(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    out = tmp_path / "run"
    summary = train.run(_tiny_cfg(out, **{"train.rounds": 1}), progress=False)
    assert summary["status"] == "finished"
    assert (out / "metrics.csv").is_file() and (out / "clients.csv").is_file()
    assert not (out / "plots").exists()
    notes = [l for l in capsys.readouterr().err.splitlines() if "matplotlib is not installed" in l]
    assert len(notes) == 1 and "fedjax_pfl[plots]" in notes[0]


def test_a_run_that_stops_early_keeps_tables_and_curves(tmp_path):
    """No snapshot ever taken (failed in round 2, no checkpoints): close() still writes CSV and curves."""
    run = _fake_run(tmp_path / "failed", 0, [0.3, 0.4], status=None)
    (run / "partition.json").write_text(json.dumps({
        "num_clients": 2, "num_classes": 3, "info": {},
        "train": {"sizes": [5, 4], "histograms": [[5, 0, 0], [1, 1, 2]]}, "test": {"sizes": [2, 1]}}))
    writer = ResultsWriter(run, refresh_seconds=0.0)
    writer.evaluated(run_folder.read_records(run)[0])
    assert (run / "metrics.csv").read_text().count("\n") == 3  # header and the two lines already in metrics.jsonl
    writer.close()
    for name in ("accuracy.png", "loss.png", "partition.png"):
        _assert_png(run / "plots" / name)
    assert not (run / "clients.csv").exists() and not (run / "plots" / "client_accuracy.png").exists()


# ----------------------------------------------------------------- report


def _fake_run(folder, seed, accuracies, method="fedavg", status="finished", seconds=None, **overrides):
    """A run folder as the CLI writes it, with chosen accuracies (one per evaluation)."""
    cfg = config_lib.build(overrides=[f"method_name={method}", "data.name=fmnist", "model.name=mlp",
                                      f"seed={seed}", f"out={folder}", *[f"{k}={v}" for k, v in overrides.items()]])
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": config_lib.to_dict(cfg), "versions": {}}))
    seconds = seconds or [1.0 + t for t in range(len(accuracies))]
    lines = [json.dumps({"round": t, "accuracy": a, "accuracy_weighted": a, "accuracy_std": 0.1, "loss": 1.0,
                         "train_loss": 1.0, "seconds": s}) for t, (a, s) in enumerate(zip(accuracies, seconds), 1)]
    (folder / "metrics.jsonl").write_text("".join(l + "\n" for l in lines))
    if status is not None:
        (folder / "summary.json").write_text(json.dumps({"status": status}))
    return folder


def test_report_groups_seeds_into_mean_and_std(tmp_path):
    curve = np.linspace(0.1, 0.5, 12)  # 12 evaluations, then a different last value per seed
    for seed, last in [(0, 0.50), (1, 0.60), (2, 0.70)]:
        _fake_run(tmp_path / "runs" / f"fedavg-{seed}", seed, [*curve[:11], last], **{"train.rounds": 12})
    _fake_run(tmp_path / "runs" / "fedprox-0", 0, [*curve[:11], 0.9], method="fedprox",
              **{"train.rounds": 12, "method.mu": 0.01})
    _fake_run(tmp_path / "runs" / "fedavg-lr", 0, [0.3, 0.4], status=None, **{"train.rounds": 12, "train.lr": 0.5})
    text = report.report([tmp_path / "runs"], tmp_path / "rep")
    with open(tmp_path / "rep" / "report.csv", newline="") as f:
        rows = {(r["method"], r["settings"]): r for r in csv.DictReader(f)}
    assert len(rows) == 3
    seeds = rows[("fedavg", "train.lr=0.005")]
    assert seeds["seeds"] == "0, 1, 2" and seeds["runs"] == "3" and seeds["status"] == "3 finished"
    # by hand: last = 0.5, 0.6, 0.7 -> mean 0.6, population std sqrt((0.01 + 0 + 0.01) / 3)
    assert float(seeds["last_mean"]) == pytest.approx(0.6)
    assert float(seeds["last_std"]) == pytest.approx(math.sqrt(0.02 / 3))
    # mean of the last 10 evaluations: curve[2:11] (shared) and the seed's own last value
    tail = curve[2:11].sum()
    per_seed = [(tail + last) / 10 for last in (0.5, 0.6, 0.7)]
    assert float(seeds["mean_last_10_mean"]) == pytest.approx(np.mean(per_seed))
    assert float(seeds["mean_last_10_std"]) == pytest.approx(np.std(per_seed))
    assert float(seeds["best_mean"]) == pytest.approx(0.6)  # each seed's best is its last value
    assert float(seeds["wall_seconds"]) == pytest.approx(12.0) and seeds["rounds"] == "12"
    prox = rows[("fedprox", "method.mu=0.01 train.lr=0.005")]
    assert prox["runs"] == "1" and float(prox["last_mean"]) == pytest.approx(0.9)
    unfinished = rows[("fedavg", "train.lr=0.5")]
    assert unfinished["status"] == "unfinished" and unfinished["rounds"] == "2/12"
    assert "| 60.00 ± 8.16 |" in text and "| 90.00 |" in text
    _assert_png(tmp_path / "rep" / "accuracy.png")


def test_wall_time_sums_the_segments_of_a_resumed_run():
    records = [{"seconds": s} for s in (5.0, 6.0, 7.0, 2.0, 3.0)]  # resumed after the third evaluation
    assert run_folder.wall_seconds(records) == 10.0


def test_report_on_failed_and_empty_runs(tmp_path):
    _fake_run(tmp_path / "failed", 0, [0.2, float("nan")], status="failed")
    _fake_run(tmp_path / "crashed", 1, [], status="failed")
    text = report.report([tmp_path / "failed", tmp_path / "crashed"], tmp_path / "rep")
    with open(tmp_path / "rep" / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["2 failed"]
    assert float(rows[0]["last_mean"]) == pytest.approx(float("nan"), nan_ok=True)
    assert float(rows[0]["best_mean"]) == pytest.approx(0.2)
    assert "2 failed" in text


def test_report_command_on_a_real_run_and_redraw(run_dir, tmp_path):
    (run_dir / "plots" / "loss.png").unlink()
    proc = subprocess.run([sys.executable, "-m", "fedjax_pfl.report", str(run_dir), "--out", str(tmp_path / "rep"),
                           "--redraw"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| fedamp | synthetic | 6 | natural | mlr | 0 |" in proc.stdout
    _assert_png(tmp_path / "rep" / "accuracy.png")
    _assert_png(run_dir / "plots" / "loss.png")


@pytest.mark.parametrize("make,needle", [
    (lambda tmp: tmp / "nosuch", "no such folder"),
    (lambda tmp: tmp, "holds no run"),
])
def test_report_bad_input_is_one_line_exit_2(tmp_path, capsys, make, needle):
    assert report_command.main([str(make(tmp_path)), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def _figure_box(fig, artist):
    fig.canvas.draw()
    return artist.get_window_extent().transformed(fig.transFigure.inverted())


def test_report_figure_with_five_long_labels_keeps_the_axes_wide(tmp_path, monkeypatch):
    """Five groups that differ in several long settings: the legend goes below the axes, inside the figure,
    and the axes keep most of the figure's width."""
    for i in range(5):
        _fake_run(tmp_path / "runs" / f"r{i}", 0, [0.3, 0.4 + 0.02 * i], method="fedprox",
                  **{"method.mu": 0.001 * 10 ** i, "train.lr": 0.01 * (i + 1), "train.local_epochs": i + 1,
                     "partition.alpha": 0.1 * (i + 1), "train.weight_decay": 0.0001 * i})
    drawn = {}
    monkeypatch.setattr(figures, "save_png", lambda fig, path: drawn.setdefault(path.name, fig))
    report.report([tmp_path / "runs"], tmp_path / "rep")
    fig = drawn["accuracy.png"]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 5 and min(len(label) for label in labels) > 60  # long labels, as promised
    axes, legend = _figure_box(fig, fig.axes[0]), _figure_box(fig, fig.legends[0])
    assert axes.width > 0.8, axes  # most of the figure's width
    assert legend.y1 <= axes.y0 and legend.x0 >= 0 and legend.x1 <= 1, (legend, axes)  # below, inside the figure


def test_partition_colour_bar_stands_beside_its_heat_map():
    hist = np.array([[5, 0, 3], [1, 4, 0], [0, 2, 6], [3, 3, 3]])
    fig = figures.partition_picture({"train": {"histograms": hist.tolist(), "sizes": hist.sum(1).tolist()},
                                     "test": {"sizes": [2, 2, 2, 2]}, "info": {}})
    heat, sizes, bar = fig.axes
    heat_box, bar_box, sizes_box = (_figure_box(fig, a) for a in (heat, bar, sizes))
    assert heat_box.x1 <= bar_box.x0 < heat_box.x1 + 0.03  # right beside the heat map
    assert bar_box.x1 < sizes_box.x0  # between it and the client sizes, not apart on the left


def test_report_counts_a_copied_run_folder_once(tmp_path, capsys):
    first = _fake_run(tmp_path / "runs" / "a", 0, [0.3, 0.5], **{"train.rounds": 2})
    shutil.copytree(first, tmp_path / "runs" / "b")
    _fake_run(tmp_path / "runs" / "c", 1, [0.3, 0.7], **{"train.rounds": 2})
    report.report([tmp_path / "runs"], tmp_path / "rep")
    err = capsys.readouterr().err
    assert "hold the same configuration with the same seed 0 (a copy?)" in err and str(tmp_path / "runs" / "b") in err
    with open(tmp_path / "rep" / "report.csv", newline="") as f:
        row, = csv.DictReader(f)
    assert row["seeds"] == "0, 1" and row["runs"] == "2" and float(row["last_mean"]) == pytest.approx(0.6)
