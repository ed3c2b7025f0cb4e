"""The command line end to end: output folder, learning on real data, user errors."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import majority_baseline
from forced_devices import cpu_devices_env
from signal_after_round import signal_after

from fedjax_pfl.engine import checkpoint
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.commands import train
from fedjax_pfl.outputs import machine
from fedjax_pfl.core.errors import DivergedError
from fedjax_pfl.runs import records as records_lib
from fedjax_pfl.runs.call_planner import CallPlanner
from fedjax_pfl.data.registry import load_dataset
from fedjax_pfl.runs.experiment import build_experiment, validate


@pytest.fixture(scope="module")
def fmnist_small(data_dir):
    """Fashion-MNIST, first 12,000 train and 2,000 test images (keeps rounds fast)."""
    ds = load_dataset("fmnist", data_dir=data_dir)
    return dataclasses.replace(ds, x_train=ds.x_train[:12000], y_train=ds.y_train[:12000],
                               x_test=ds.x_test[:2000], y_test=ds.y_test[:2000])


def _cfg(method, **overrides):
    cfg = config_lib.build(overrides=[
        f"method_name={method}", "data.name=fmnist", "model.name=mlp", "model.hidden=[64]",
        "partition.scheme=dirichlet", "partition.alpha=0.3", "partition.num_clients=20",
        "train.local_epochs=1", "train.batch_size=32", "train.lr=0.05", "train.join_ratio=0.5",
        *[f"{k}={v}" for k, v in overrides.items()]])
    return cfg


def _accuracy(exp, rounds, seed=0):
    key = jax.random.key(seed)
    server, clients, _ = exp.engine.run(*exp.engine.init(key), key, rounds)
    return exp.engine.evaluate_summary(server, clients, key)


@pytest.fixture(scope="module")
def fmnist_fedavg_accuracy(fmnist_small):
    """FedAvg's accuracy after the same 4 rounds on the same clients."""
    return _accuracy(build_experiment(validate(_cfg("fedavg")), dataset=fmnist_small), 4)["accuracy"]


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedper", "fedrep", "local"])
def test_learns_on_fashion_mnist(method, fmnist_small, fmnist_fedavg_accuracy):
    """20 clients, Dirichlet 0.3, MLP, 4 rounds. Measured over partition seeds 0-2: majority
    0.44-0.46, FedAvg and FedProx 0.72-0.74, Local 0.76-0.77, FedPer and FedRep 0.81-0.84."""
    exp = build_experiment(validate(_cfg(method)), dataset=fmnist_small)
    result = _accuracy(exp, 4)
    majority = majority_baseline.from_engine(exp.engine)
    assert result["accuracy"] > majority + 0.2, (result, majority)
    if method in ("fedper", "fedrep"):  # a personal head beats FedAvg's global model under label skew
        assert result["accuracy"] > fmnist_fedavg_accuracy, (result, fmnist_fedavg_accuracy)
    assert np.isfinite(result["loss"])


def test_cli_writes_output_folder(tmp_path, data_dir):
    out = tmp_path / "run"
    env = {**os.environ, "FEDJAX_PFL_DATA_DIR": str(data_dir)}
    cmd = [sys.executable, "-m", "fedjax_pfl.train", "--method", "fedper", "--dataset", "fmnist",
           "--num-clients", "20", "--rounds", "3", "--model", "mlp", "--local-epochs", "1",
           "--batch-size", "64", "--lr", "0.05", "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["method_name"] == "fedper" and "jax" in config["versions"]
    assert config["versions"]["machine"] == machine.describe()  # the hardware a number came from
    partition = json.loads((out / "partition.json").read_text())
    assert partition["num_clients"] == 20 and len(partition["train"]["histograms"]) == 20
    assert partition["info"]["scheme"] == "dirichlet"
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3]  # counted from 1
    for r in lines:
        assert {"accuracy", "accuracy_weighted", "accuracy_std", "loss", "seconds"} <= set(r)
    summary = json.loads((out / "summary.json").read_text())
    # FedPer, not FedAvg: on Dirichlet 0.1 FedAvg's global model is still at the majority baseline
    # after 3 rounds (0.53-0.70 vs 0.62-0.67 over partition seeds 0-2), FedPer 0.84-0.93
    assert summary["last"]["round"] == 3 and summary["last"]["accuracy"] > majority_baseline.from_run(out) + 0.1


def _cli(args, env_extra=None, signal_at=None):
    """The training command in a subprocess; ``signal_at=(rounds, "KILL")`` signals it after that many rounds."""
    env = {**os.environ, **(env_extra or {})}
    command = ["-m", "fedjax_pfl.train"] if signal_at is None else [
        str(Path(__file__).parent / "signal_after_round.py"), *map(str, signal_at)]
    return subprocess.run([sys.executable, *command, "--no-progress", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args,needle", [
    (["--method", "nosuch"], "unknown method 'nosuch'"),
    (["--method", "fedavg", "--dataset", "nosuch"], "unknown dataset 'nosuch'"),
    (["--method", "fedavg", "--dataset", "synthetic", "--model", "nosuch"], "model.name must be one of: auto, fedavgcnn"),
    (["--method", "fedprox", "--dataset", "synthetic", "method.nosuch=1"], "unknown method option 'nosuch'"),
    (["--method", "fedavg", "--dataset", "synthetic", "train.nosuch=1"], "unknown config key 'train.nosuch'"),
    (["--method", "pfedme", "--dataset", "synthetic", "--model", "mlr", "--optimizer", "adam", "train.momentum=0.5"],
     "so train.optimizer=adam, train.momentum=0.5 would be ignored"),
])
def test_user_errors_exit_cleanly(args, needle):
    proc = _cli(args)
    assert proc.returncode == 2, proc.stderr
    assert needle.lower() in proc.stderr.lower()
    assert "Traceback" not in proc.stderr


def test_impossible_partition_is_a_user_error(data_dir, tmp_path):
    proc = _cli(["--method", "fedavg", "--dataset", "mnist", "--num-clients", "80000", "--model", "mlr",
                 "--out", str(tmp_path / "r")], {"FEDJAX_PFL_DATA_DIR": str(data_dir)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "clients" in proc.stderr


def test_missing_data_file_names_the_file_and_folders(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _cli(["--method", "fedavg", "--dataset", "mnist", "--model", "mlr", "--data-dir", str(empty),
                 "--out", str(tmp_path / "r")], {"FEDJAX_PFL_DATA_DIR": str(empty), "XDG_CACHE_HOME": str(tmp_path)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "train-images-idx3-ubyte.gz" in proc.stderr and str(empty) in proc.stderr


def test_default_dataset_missing_says_how_to_get_it_and_mentions_synthetic(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _cli(["--method", "fedavg", "--out", str(tmp_path / "r")],
                {"FEDJAX_PFL_DATA_DIR": str(empty), "XDG_CACHE_HOME": str(tmp_path)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cifar" in proc.stderr.lower() and "--dataset synthetic" in proc.stderr


def test_dotted_overrides_and_presets(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("train:\n  lr: 0.1\n  rounds: 7\nmethod:\n  mu: 0.5\n")
    cfg = config_lib.build(str(preset), ["train.rounds=9", "model.hidden=[32, 16]"])
    assert cfg.train.lr == 0.1 and cfg.train.rounds == 9 and cfg.method == {"mu": 0.5}
    assert cfg.model.hidden == (32, 16)
    with pytest.raises(config_lib.UserError, match="whole number"):
        config_lib.build(overrides=["train.rounds=2.5"])


TINY = ["--dataset", "synthetic", "--model", "mlp", "model.hidden=[16]", "--num-clients", "6",
        "--partition", "natural", "--local-epochs", "1", "--lr", "0.05", "--no-progress"]


def _records(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def _without_seconds(records):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """FedPer, 4 rounds, checkpoint every round, run without a break (in process, umask 027)."""
    out = tmp_path_factory.mktemp("full") / "run"
    old = os.umask(0o027)
    try:
        assert train.main(["--method", "fedper", *TINY, "--rounds", "4", "--checkpoint-every", "1",
                           "--out", str(out)]) == 0
    finally:
        os.umask(old)
    return out


def _numbers(record, path=""):
    """{path: value} of a JSON record's leaves, without wall-clock 'seconds'."""
    if isinstance(record, dict):
        return {k: v for key, value in record.items() if key != "seconds"
                for k, v in _numbers(value, f"{path}/{key}").items()}
    return {path: record}


def _assert_close(got, want):
    got, want = _numbers(got), _numbers(want)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == (pytest.approx(want[k], rel=1e-4, abs=1e-5) if isinstance(want[k], float) else want[k]), k


def test_killed_sharded_run_resumed_on_other_devices_equals_uninterrupted_run(uninterrupted, tmp_path):
    """kill -9 (a real SIGKILL from the test hook) during round 2 of a run whose client state is split
    over 4 (forced CPU) devices (6 clients padded to 8), then --resume from round 1's checkpoint on 2
    devices (padded to 6: the checkpoint's empty rows are cut): summary.json and every metrics record
    equal the uninterrupted one-device run's up to float rounding (exact equality on one device: the
    Ctrl-C test below)."""
    out = tmp_path / "run"
    args = ["--method", "fedper", *TINY, "--rounds", "4", "--checkpoint-every", "1", "--out", str(out),
            "--rounds-per-call", "1"]  # one compiled program per process
    devices = cpu_devices_env
    killed = _cli(args, devices(4), signal_at=(2, "KILL"))
    assert killed.returncode == -9 and not (out / "summary.json").exists(), killed.stderr[-3000:]
    killed_seconds = _records(out)[-1]["seconds"]
    resumed = _cli([*args, "--resume"], devices(2))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_close(json.loads((out / "summary.json").read_text()), json.loads((uninterrupted / "summary.json").read_text()))
    assert len(_records(out)) == len(_records(uninterrupted))
    for got, want in zip(_records(out), _records(uninterrupted)):
        _assert_close(got, want)
    assert _records(out)[1]["seconds"] > killed_seconds  # time continues, it does not restart from zero
    resumed = json.loads((out / "config.json").read_text())["resumed"]
    assert [(r["after_round"], r["rounds"]) for r in resumed] == [(1, 4)]


def test_ctrl_c_stops_after_the_round_and_the_resume_may_extend_the_rounds(uninterrupted, tmp_path, capsys):
    """Ctrl-C in round 2 of 3 (no --checkpoint-every): checkpoint + summary written, exit 130; then
    --resume --rounds 4 with no other flag (the rest comes from config.json) equals the 4-round run."""
    out = tmp_path / "run"
    assert train.main(["--method", "fedper", *TINY, "--rounds", "3", "--out", str(out)],
                      observe=signal_after(2, "INT")) == 130
    printed = capsys.readouterr()
    err = printed.err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("Ctrl-C: stopping after round 2 of 3, with a checkpoint")
    assert "interrupted after round 2" in err[1] and "--resume" in err[1]
    wrote = next(line for line in printed.out.splitlines() if line.startswith("wrote "))
    listed = wrote.split("(", 1)[1].rstrip(")").split(", ")
    assert "metrics.jsonl" in listed and "clients.csv" not in listed  # no snapshot was taken: not claimed
    assert all((out / name).is_file() for name in listed), listed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds_evaluated"] == 2
    assert checkpoint.exists(checkpoint.checkpoint_path(out))
    assert train.main(["--out", str(out), "--resume", "--rounds", "4", "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text()) == json.loads((uninterrupted / "summary.json").read_text())
    assert _without_seconds(_records(out)) == _without_seconds(_records(uninterrupted))
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["train"]["rounds"] == 4
    assert [(r["after_round"], r["rounds_before"], r["rounds"]) for r in config["resumed"]] == [(2, 3, 4)]


def test_a_run_resumed_with_another_client_mapping_equals_the_uninterrupted_run(uninterrupted, tmp_path):
    """The client mapping lays the same arithmetic out differently: a run checkpointed under vmap may
    continue under map (e.g. on another machine) and ends as the uninterrupted run, up to float rounding."""
    out = tmp_path / "run"
    assert train.main(["--method", "fedper", *TINY, "--rounds", "2", "--checkpoint-every", "1", "--out", str(out),
                       "--client-mapping", "vmap"]) == 0
    assert train.main(["--out", str(out), "--resume", "--rounds", "4", "--no-progress", "--client-mapping",
                       "map"]) == 0
    _assert_close(json.loads((out / "summary.json").read_text()), json.loads((uninterrupted / "summary.json").read_text()))
    for got, want in zip(_records(out), _records(uninterrupted), strict=True):
        _assert_close(got, want)
    assert json.loads((out / "config.json").read_text())["config"]["train"]["client_mapping"] == "map"


def test_output_records_eval_model_and_uses_the_umask(uninterrupted):
    for name in ("config.json", "partition.json", "metrics.jsonl", "summary.json"):
        assert (uninterrupted / name).stat().st_mode & 0o777 == 0o640, name
    saved = [p for p in checkpoint.checkpoint_path(uninterrupted).rglob("*") if p.is_file()]
    assert saved and {p.stat().st_mode & 0o777 for p in saved} == {0o640}
    assert [p.name for p in checkpoint.checkpoint_path(uninterrupted).iterdir()] == ["4"]  # the last round only
    config = json.loads((uninterrupted / "config.json").read_text())
    assert config["config"]["eval"]["model"] == "global"  # fedper's default, resolved from 'auto'
    assert config["data_files"] == []  # generated data
    assert {r["eval_model"] for r in _records(uninterrupted)} == {"global"}
    assert json.loads((uninterrupted / "summary.json").read_text())["eval_model"] == "global"


@pytest.fixture(scope="module")
def stopped_after_three(tmp_path_factory):
    """The 4-round FedPer run of `uninterrupted`, stopped by Ctrl-C after round 3 (checkpoint and records 1-3)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    assert train.main(["--method", "fedper", *TINY, "--rounds", "4", "--checkpoint-every", "1", "--out", str(out)],
                      observe=signal_after(3, "INT")) == 130
    assert [r["round"] for r in _records(out)] == [1, 2, 3]
    return out


def _damaged_copy(run, tmp_path, line: int):
    """A copy of ``run`` whose metrics.jsonl line ``line`` (from 1) is cut in half."""
    copy = tmp_path / f"damaged{line}"
    shutil.copytree(run, copy)
    lines = (copy / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[line - 1] = lines[line - 1][: len(lines[line - 1]) // 2] + "\n"
    (copy / "metrics.jsonl").write_text("".join(lines))
    return copy


@pytest.mark.parametrize("line", [1, 2, 3], ids=["first", "middle", "last"])
def test_resume_refuses_a_damaged_record_it_would_lose(stopped_after_three, tmp_path, capsys, line):
    run = _damaged_copy(stopped_after_three, tmp_path, line)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert train.main(["--out", str(run), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and f"metrics.jsonl line {line} is damaged" in err[0]
    assert f"held round {line}" in err[0] and "restore that line" in err[0]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing touched


def test_resume_drops_a_torn_line_of_a_round_after_the_checkpoint(stopped_after_three, uninterrupted, tmp_path,
                                                                   capsys):
    """A kill while writing round 4's line (after round 3's checkpoint): round 4 runs again, no record lost."""
    run = tmp_path / "torn"
    shutil.copytree(stopped_after_three, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(_records(uninterrupted)[3])[:40])
    assert train.main(["--out", str(run), "--resume", "--no-progress"]) == 0
    assert "line 4 is damaged (a write cut short)" in capsys.readouterr().err
    assert _without_seconds(_records(run)) == _without_seconds(_records(uninterrupted))


@pytest.mark.parametrize("line", [1, 2, 3], ids=["first", "middle", "last"])
def test_report_warns_on_a_damaged_line_and_reads_every_valid_record(stopped_after_three, tmp_path, capsys, line):
    from fedjax_pfl.outputs import report

    run = _damaged_copy(stopped_after_three, tmp_path, line)
    loaded = report.load_run(run)
    err = capsys.readouterr().err
    assert f"metrics.jsonl line {line} is not a metrics record (damaged); read the 2 valid record(s)" in err
    assert loaded.rounds.tolist() == [r for r in (1, 2, 3) if r != line]


def test_round_numbers_count_from_one_everywhere(uninterrupted):
    """metrics.jsonl, metrics.csv, summary.json and the checkpoint's folder name agree."""
    records = _records(uninterrupted)
    assert [r["round"] for r in records] == [1, 2, 3, 4]
    csv_rounds = [int(line.split(",")[0]) for line in (uninterrupted / "metrics.csv").read_text().splitlines()[1:]]
    assert csv_rounds == [1, 2, 3, 4]
    summary = json.loads((uninterrupted / "summary.json").read_text())
    assert summary["last"]["round"] == 4 and summary["best_optimistic"]["by_accuracy"]["round"] in (1, 2, 3, 4)
    assert [p.name for p in checkpoint.checkpoint_path(uninterrupted).iterdir()] == ["4"]


def test_method_help_lists_the_methods_options_with_defaults(capsys):
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.methods.options import describe

    assert train.main(["--method", "fedprox", "--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: python -m fedjax_pfl.train" in text and "method fedprox: FedProx" in text
    assert "  mu               float, default 0.01; >= 0" in text and "weight of the proximal term" in text
    assert train.main(["--method", "fedas", "--help"]) == 0
    text = capsys.readouterr().out
    for option in describe(get_method("fedas").hparams_type):
        assert f"  {option.name} " in text and option.help in text
    assert train.main(["--help"]) == 0 and "method fedas" not in capsys.readouterr().out


def test_config_json_records_every_method_option_with_its_value(tmp_path):
    from fedjax_pfl.methods import get_method
    from fedjax_pfl.methods.options import describe
    from fedjax_pfl.runs.run_writer import write_start

    args, overrides = train.parse_args(["--method", "fedas", "method.align_lr=0.05", "--out", str(tmp_path / "r")])
    cfg = train.settle(train.config_from_args(args, overrides)).config
    write_start(tmp_path / "r", cfg, [], {})
    saved = json.loads((tmp_path / "r" / "config.json").read_text())["config"]["method"]
    assert set(saved) == {o.name for o in describe(get_method("fedas").hparams_type)}
    assert saved["align_lr"] == 0.05 and saved["align"] is True and saved["fisher"] == "batch"


def test_a_run_saved_before_a_key_existed_resumes_with_the_keys_default():
    """config.json of an older version lacks later keys (model.init, ...): it ran with their defaults."""
    saved = config_lib.to_dict(config_lib.build())
    del saved["model"]["init"], saved["partition"]["size_range"]
    assert config_lib.resume_differences(saved, config_lib.to_dict(config_lib.build())) == []
    torch = config_lib.to_dict(config_lib.build(overrides=["model.init=torch"]))
    assert config_lib.resume_differences(saved, torch) == ["model.init: 'flax' -> 'torch'"]


def test_a_run_saved_before_a_method_option_existed_counts_it_at_its_default():
    """A method option added later (FedAvg's local_steps) is absent from an older run's config.json: it ran
    with the option's default; a value other than the default is a difference."""
    saved = config_lib.to_dict(config_lib.build(overrides=["method_name=fedavg"]))
    saved["method"] = {"finetune_epochs": 0, "finetune_part": "all"}
    resolved = {**saved["method"], "local_steps": None}
    assert config_lib.resume_differences(saved, {**saved, "method": resolved}) == []
    stepped = {**saved, "method": {**resolved, "local_steps": 20}}
    assert config_lib.resume_differences(saved, stepped) == [
        "method: {'finetune_epochs': 0, 'finetune_part': 'all', 'local_steps': None} -> "
        "{'finetune_epochs': 0, 'finetune_part': 'all', 'local_steps': 20}"]


def test_data_files_read_are_recorded(data_dir):
    from fedjax_pfl.data import files, idx

    spec = idx.MNIST_FILES[3]
    with files.recording_reads() as read:
        files.find_file(spec, "mnist", data_dir=data_dir)
    assert read == [data_dir / "mnist" / spec.name]
def test_non_finite_loss_names_the_first_bad_round_and_clients_between_evaluations(tmp_path, capsys):
    out = tmp_path / "nan"
    code = train.main(["--method", "fedavg", *TINY, "--rounds", "3", "--eval-every", "10", "--lr", "1e38",
                       "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "round 1: training loss is not finite for client(s) " in err and "--lr" in err
    assert (out / "config.json").is_file()  # what was written stays
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"


def test_non_finite_loss_names_the_methods_own_step_sizes(tmp_path, capsys):
    """pFedMe diverges through its inner step size as well as train.lr: the hint names method.personal_lr."""
    code = train.main(["--method", "pfedme", *TINY, "--rounds", "1", "method.personal_lr=1e38",
                       "--out", str(tmp_path / "nan")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "training loss is not finite" in err and "(--lr, method.personal_lr)" in err


def test_first_bad_round_reads_a_list_of_round_metrics():
    nan = float("nan")
    records = [{"round": 3, "client_loss": np.array([0.5, 0.4]), "selected": np.array([4, 1])},
               {"round": 4, "client_loss": np.array([0.5, nan, np.inf]), "selected": np.array([2, 0, 5])},
               {"round": 5, "client_loss": np.array([nan]), "selected": np.array([3])}]
    assert records_lib.first_bad_round(records) == (4, [0, 5])
    assert records_lib.first_bad_round(records[:1]) is None
    with pytest.raises(DivergedError, match="round 5: .* client\\(s\\) 0, 5"):
        records_lib.check_rounds(records)


def test_options_and_overrides_in_any_order(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("train:\n  lr: 0.1\n")
    args, overrides = train.parse_args(["--config", str(preset), "--method", "pfedme", "method.lamda=15",
                                        "--rounds", "3", "train.batch_size=7"])
    cfg = train.config_from_args(args, overrides)
    assert (cfg.method_name, cfg.method, cfg.train.rounds, cfg.train.batch_size, cfg.train.lr) == (
        "pfedme", {"lamda": 15}, 3, 7, 0.1)
    with pytest.raises(config_lib.UserError, match="unrecognized arguments: stray"):
        train.parse_args(["--method", "fedavg", "stray"])


def test_summary_labels_the_best_round_on_both_accuracies():
    from fedjax_pfl.outputs.run_output import final_summary

    rows = [(0, 0.5, 0.7), (1, 0.6, 0.65), (2, 0.55, 0.6)]
    summary = final_summary([{"round": r, "accuracy": a, "accuracy_weighted": w, "accuracy_std": 0.1, "loss": 1.0}
                             for r, a, w in rows])
    assert summary["best_optimistic"]["by_accuracy"] == {"round": 1, "accuracy": 0.6, "accuracy_weighted": 0.65}
    assert summary["best_optimistic"]["by_accuracy_weighted"] == {"round": 0, "accuracy": 0.5,
                                                                  "accuracy_weighted": 0.7}
    assert summary["mean_last_10"]["evaluations"] == 3


@pytest.mark.parametrize("method,default", [("fedper", "global"), ("fedrep", "global"), ("pfakd", "global"),
                                            ("fedpac", "global"), ("fedas", "local"), ("fedavg", "global"),
                                            ("local", "local")])
def test_eval_model_defaults_follow_the_authors(method, default):
    from fedjax_pfl.methods import get_method

    assert get_method(method).eval_models[0] == default


def test_eval_model_global_is_the_global_body_with_the_own_head(uninterrupted):
    saved = json.loads((uninterrupted / "config.json").read_text())["config"]
    cfg = config_lib.build(start=saved, overrides=["eval.model=local"])
    exp = build_experiment(validate(cfg))
    method, key = exp.engine.method, jax.random.key(0)
    (server, clients), _, _ = checkpoint.restore(checkpoint.checkpoint_path(uninterrupted), exp.engine.init(key))
    client = jax.tree.map(lambda a: a[0], clients)
    assert method.eval_model == "local"
    local = method.eval_variables(server, client, None, key)
    same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
    same(local, client["variables"])
    global_method = method.algorithm(dataclasses.replace(method.setup, eval_model="global"), method.options)
    glob = global_method.eval_variables(server, client, None, key)
    same(glob["params"]["body"], server["body"]["params"])
    same(glob["params"]["head"], client["variables"]["params"]["head"])
    assert not np.array_equal(glob["params"]["body"]["mlp"]["dense0"]["kernel"],
                              local["params"]["body"]["mlp"]["dense0"]["kernel"])


def test_call_planner_fuses_after_a_timed_round_and_ends_calls_at_checkpoints():
    fixed = CallPlanner(4, total_rounds=10, checkpoint_every=3)
    assert [fixed.stop_after(t) for t in (0, 3, 6, 9)] == [3, 6, 9, 10]  # calls end at checkpoint rounds
    plain = CallPlanner(4, total_rounds=10, checkpoint_every=0)
    assert [plain.stop_after(t) for t in (0, 4, 8)] == [4, 8, 10]
    auto = CallPlanner(0, total_rounds=100, checkpoint_every=0, target_seconds=2.0)
    assert auto.count == 1 and auto.compiling
    auto.done(1, 5.0, 99)  # the first call compiles: not timed
    assert auto.count == 1 and not auto.compiling
    auto.done(1, 0.25, 98)  # 0.25 s per round: 8 rounds make ~2 s
    assert auto.count == 8 and auto.compiling
    auto.done(8, 2.0, 90)
    assert auto.count == 8 and not auto.compiling  # fused once, then kept
    slow = CallPlanner(0, total_rounds=100, checkpoint_every=0)
    slow.done(1, 9.0, 99), slow.done(1, 3.0, 98)
    assert slow.count == 1 and not slow.compiling  # a round longer than the target stays alone
    short = CallPlanner(0, total_rounds=3, checkpoint_every=0)
    short.done(1, 1.0, 2), short.done(1, 0.01, 1)
    assert short.count == 1  # one round left: no second program compiled for it
    tiny = CallPlanner(0, total_rounds=1000, checkpoint_every=0)
    tiny.done(1, 1.0, 999), tiny.done(1, 1e-4, 998)
    assert tiny.count == 50  # at most 50 rounds per call
