"""A new user's first run: ``--method fedas`` alone trains offline on the project's data folder (the CIFAR-10
that is there, named as such), any dataset gets a model that fits its inputs, the run says how long it will
take before and after its first round, and the bar says "compiling" only while XLA compiles."""

import dataclasses
import json
import re
import sys

import pytest
from signal_after_round import signal_after

from fedjax_pfl.data import files, registry
from fedjax_pfl.engine import mapping_choice
from fedjax_pfl.engine.round_progress import Event
from fedjax_pfl.commands import train as cli
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs import progress as progress_lib
from fedjax_pfl.outputs import wall_time


@pytest.fixture
def one_compile(monkeypatch):
    """The 40-round default run keeps the client mapping's default untimed here (as a run of fewer rounds
    does): timing it compiles the round a second time, which is most of these tests' cost."""
    monkeypatch.setattr(mapping_choice, "MIN_ROUNDS", 41)


def _smaller(dataset, train: int, test: int):
    return dataclasses.replace(dataset, x_train=dataset.x_train[:train], y_train=dataset.y_train[:train],
                               x_test=dataset.x_test[:test], y_test=dataset.y_test[:test])


def _only_run(folder):
    runs = list((folder / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def test_the_headline_command_trains_offline_on_the_projects_data(tmp_path, data_dir, monkeypatch, capsys,
                                                                  one_compile):
    """``python -m fedjax_pfl.train --method fedas`` and nothing else, with the project's data folder (which
    holds cifar10_jpeg, not the official files) and no network: it picks cifar10_jpeg and says so, picks
    fedavgcnn, estimates the wall time before round 1, and trains; SIGTERM after round 1 stops it (exit 143).
    The JPEG copy is cut to 3,000 images here so that round 1 is cheap; every file is read as it is."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(files.ENV_DATA_DIR, str(data_dir))
    monkeypatch.setenv(files.ENV_BASE_URL, "http://127.0.0.1:9/")  # nothing listens: a download would fail
    read = registry.DATASETS["cifar10_jpeg"]
    monkeypatch.setitem(registry.DATASETS, "cifar10_jpeg", lambda **kwargs: _smaller(read(**kwargs), 2400, 600))
    assert cli.main(["--method", "fedas"], observe=signal_after(1, "TERM")) == 143
    printed = capsys.readouterr().out
    assert "data.name: cifar10_jpeg (auto: the official cifar10 files are not here; the project's lossy JPEG copy" \
           in printed
    assert "model.name: fedavgcnn (auto: the default for images)" in printed
    assert printed.index("wall time: ") < printed.index("compiling 1 round per call")  # before the first round
    out = _only_run(tmp_path)
    record = json.loads((out / "config.json").read_text())
    assert record["config"]["data"]["name"] == "cifar10_jpeg" and record["config"]["model"]["name"] == "fedavgcnn"
    assert "JPEG copy" in record["resolved"]["data.name"]
    assert any(path.endswith("cifar10-jpeg-q75.tar.gz") for path in record["data_files"])
    assert [r["round"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["after_round"] == 1


def test_fedas_on_synthetic_data_runs_with_a_vector_model(tmp_path, monkeypatch, capsys, one_compile):
    """``--method fedas --dataset synthetic``: feature vectors get an MLP (FedAS needs a body to align), where
    the default image CNN used to stop the run."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--method", "fedas", "--dataset", "synthetic"], observe=signal_after(1, "TERM")) == 143
    assert "model.name: mlp (auto: the default for feature vectors)" in capsys.readouterr().out
    out = _only_run(tmp_path)
    assert json.loads((out / "config.json").read_text())["config"]["model"]["name"] == "mlp"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_auto_prefers_the_official_files_and_says_when_neither_is_there(tmp_path, monkeypatch):
    monkeypatch.delenv(files.ENV_DATA_DIR, raising=False)
    monkeypatch.setenv(files.ENV_CACHE_DIR, str(tmp_path / "cache"))
    official = tmp_path / "with" / "cifar10" / "cifar-10-batches-py"
    official.mkdir(parents=True)
    assert registry.resolve_auto(tmp_path / "with")[0] == "cifar10"
    (tmp_path / "none").mkdir()
    name, why = registry.resolve_auto(tmp_path / "none")
    assert name == "cifar10" and "neither" in why


def test_an_explicit_dataset_or_model_is_kept():
    from fedjax_pfl.runs.experiment import validate

    cfg = validate(config_lib.build(overrides=["data.name=mnist", "model.name=mlp"])).config
    assert (cfg.data.name, cfg.model.name) == ("mnist", "mlp")
    cfg = validate(config_lib.build(overrides=["data.name=mnist"])).config
    assert cfg.model.name == "fedavgcnn"


# ------------------------------------------------------------------ the wall-time estimate


def test_the_estimate_comes_from_round_one_with_the_hint_and_is_refined_when_it_moves():
    estimate = wall_time.WallTimeEstimate(total=40, done=0, where="cpu x2")
    assert estimate.before_first_round() == ["wall time: estimated from round 1 once it ends (40 rounds to run on "
                                             "cpu x2)"]
    lines = estimate.call_done(rounds=1, seconds=163.0, compile_seconds=13.0)
    assert lines[0].startswith("wall time: about 1 h 38 min for the 39 rounds left on cpu x2 (150 s a round")
    assert lines[1] == "wall time: " + wall_time.SHORTER
    assert estimate.call_done(rounds=1, seconds=150.0, compile_seconds=0.0) == []  # as estimated: nothing new
    moved = estimate.call_done(rounds=1, seconds=600.0, compile_seconds=0.0)  # a much slower round
    assert moved and moved[0].startswith("wall time: about 3 h 5 min for the 37 rounds left on cpu x2 (300 s a round")
    assert wall_time.WallTimeEstimate(3, 0, "cpu").call_done(1, 2.0, 0.5)[0].startswith(
        "wall time: about 3.0 s for the 2 rounds left on cpu (1.5 s a round")  # short: no hint
    timed = wall_time.WallTimeEstimate(40, 0, "cpu", timed_round=90.0).before_first_round()
    assert timed[0] == ("wall time: about 1 h for the 40 rounds left on cpu (90 s a round, timed while choosing "
                        "the client mapping)")


def test_the_estimate_during_the_first_round_uses_how_far_it_is():
    estimate = wall_time.WallTimeEstimate(total=10, done=0, where="cpu")
    assert estimate.left(position=0.01, in_call=5.0) is None  # too early to say
    assert estimate.left(position=0.5, in_call=30.0) == pytest.approx(9.5 * 60.0)


# ------------------------------------------------------------------ the bar


def test_the_bar_says_compiling_only_until_xla_compiled_and_its_clock_never_jumps(monkeypatch, capsys):
    monkeypatch.setattr(progress_lib, "LOG_INTERVAL", 0.0)
    display = progress_lib.RunProgress(total=40, done=0, clients=12, enabled=True, devices=2)
    started = display.bar.start_t
    display.call_starts(0, 1, compiling=True, count=1)
    assert display.compiling
    display.compile_event(progress_lib.TRACE_EVENT, 2.0)
    display.compile_event(progress_lib.BACKEND_EVENT, 11.0)  # XLA is done: the round runs, no event yet
    assert not display.compiling and display.postfix == "round 1/40: running"
    display.event(Event("client", 0, 0, 1))
    display.event(Event("step", 64, 128, 1))  # one client done, each device's next one half way
    assert display.postfix == "round 1/40: 1/12 clients, local step 64/128"
    assert display.bar.n == pytest.approx((1 + 2 * 0.5) / 12)
    display.call_done(1, 0.4)
    assert display.bar.start_t == started  # the elapsed time is the wall clock's
    display.close()
    printed = capsys.readouterr()
    assert printed.out.count("compiled in 13.0 s") == 1
    assert not re.search(r"compiling \d+ s\]", printed.err.split("round 1/40: running")[-1])


def test_help_lists_every_partition_the_config_accepts(capsys):
    from fedjax_pfl.data.partition import SCHEMES

    assert cli.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    listed = re.search(r"--partition SCHEME how samples are dealt to clients;.*? \(one of: ([^)]*)\)", text).group(1)
    assert listed.split(", ") == [config_lib.AUTO, *SCHEMES, *config_lib.OWN_SCHEMES]
    assert {"client_dirichlet", "pfllib_dirichlet"} <= set(listed.split(", "))


@pytest.mark.parametrize("eval_model,words", [("global", "test accuracy of the global model, per client"),
                                              ("local", "test accuracy of a client's own model, per client")])
def test_the_per_client_histogram_names_the_model_evaluated(eval_model, words):
    from fedjax_pfl.outputs import figures

    clients = [{"accuracy": a} for a in (0.2, 0.5, 0.9)]
    figure = figures.client_accuracy_histogram(clients, eval_model=eval_model)
    assert figure.axes[0].get_xlabel() == words
