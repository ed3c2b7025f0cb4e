"""How the training command ends where the machine, not the configuration, is at fault: a platform JAX cannot
start, a flag XLA does not know, a standard output that is full or whose reader went away, a stop signal while
the main thread waits on a long computation, more runs than files the process may open, an optional package
missing; and a run resumed from another working directory. Each refusal is a case of tests/bad_input_cases.py."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input_cases import TINY, assert_case
from fedjax_pfl.commands import train as cli
from fedjax_pfl.engine import checkpoint

HERE = Path(__file__).parent
TRAIN = ["-m", "fedjax_pfl.train", "--method", "fedavg", *TINY]


def _env(tmp_path, **extra) -> dict:
    """This process's environment with its own cache folder (no remembered environment check) and ``extra``."""
    return {**os.environ, "FEDJAX_PFL_CACHE_DIR": str(tmp_path / "cache"), **extra}


def _run(args, env, **kwargs) -> subprocess.CompletedProcess:
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.run([sys.executable, *map(str, args)], env=env, text=True, timeout=300, **streams)


def _records(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ the environment JAX starts in


def test_a_platform_jax_cannot_start_and_a_flag_xla_does_not_know_are_one_line_each(tmp_path):
    """XLA aborts the process on an unknown XLA_FLAGS flag (a fatal log, exit 1) and JAX fails on a platform the
    machine lacks with an internal error; both are tried in a child process before JAX starts here."""
    pytest.importorskip("jax")
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_fedjax_pfl_no_such_flag=1".strip()
    proc = _run([*TRAIN, "--out", tmp_path / "r"], _env(tmp_path, XLA_FLAGS=flags))
    assert_case("unknown_xla_flag", proc.returncode, proc.stderr, tmp=tmp_path)
    import jax

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a cuda backend")
    proc = _run([*TRAIN, "--out", tmp_path / "r"], _env(tmp_path, JAX_PLATFORMS="cuda"))
    assert_case("jax_platforms_unavailable", proc.returncode, proc.stderr, tmp=tmp_path)
    assert not (tmp_path / "r").exists()
    ok = _run([*TRAIN, "--rounds", "1", "--out", tmp_path / "ok"], _env(tmp_path))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert len(list((tmp_path / "cache" / "environments").iterdir())) == 1  # an environment that started: tried once


# ------------------------------------------------------------------ standard output


def test_standard_output_that_cannot_be_written_is_one_line_before_any_work(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        proc = _run([*TRAIN, "--out", tmp_path / "r"], _env(tmp_path), stdout=full, stderr=subprocess.PIPE)
    assert_case("stdout_full", proc.returncode, proc.stderr, tmp=tmp_path)
    assert not (tmp_path / "r").exists()


def _popen(args, tmp_path):
    return subprocess.Popen([sys.executable, *map(str, args)], env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_output_closed_while_loading_ends_the_command_at_once(tmp_path):
    """``| head -1``: the reader takes the first line and goes; the next line finds no reader."""
    proc = _popen([*TRAIN, "--out", tmp_path / "r"], tmp_path)
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert_case("stdout_closed_before_rounds", proc.wait(timeout=300), err, tmp=tmp_path)
    assert not (tmp_path / "r").exists()  # nothing was written: no folder left


def test_output_closed_mid_run_stops_with_a_checkpoint_and_resume_continues_exactly(tmp_path):
    args = [*TINY[:TINY.index("--rounds")], "--rounds", "3", "--rounds-per-call", "1", "--checkpoint-every", "1",
            "--no-progress"]
    whole = tmp_path / "whole"
    assert cli.main(["--method", "fedavg", *args, "--out", str(whole)]) == 0
    out = tmp_path / "run"
    proc = _popen(["-m", "fedjax_pfl.train", "--method", "fedavg", *args, "--out", out], tmp_path)
    while not proc.stdout.readline().startswith("compiling"):  # round 1 compiles: the next line finds no reader
        pass
    proc.stdout.close()
    err = proc.stderr.read()
    assert_case("stdout_closed_mid_run", proc.wait(timeout=300), err, tmp=tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["after_round"] == 1
    assert checkpoint.latest_round(checkpoint.checkpoint_path(out)) == 1
    assert cli.main(["--out", str(out), "--resume", "--no-progress"]) == 0
    assert _records(out) == _records(whole)


# ------------------------------------------------------------------ stop signals


@pytest.mark.parametrize("case,signum", [("ctrl_c_in_a_long_computation", signal.SIGINT),
                                         ("sigterm_in_a_long_computation", signal.SIGTERM)])
def test_a_stop_signal_ends_the_command_while_its_main_thread_waits_on_a_computation(case, signum, tmp_path):
    """The command ends within seconds whatever its main thread waits on: where Python's handler runs (JAX lets
    it while it blocks on a result) the command ends within 3 s of its line though the computation goes on, and
    where it does not (inside a compile) a watcher thread, woken at once, ends it 3 s after the signal. (Without
    either this helper would never end: its computation has no end.)"""
    proc = _popen([HERE / "busy_when_signalled.py"], tmp_path)
    assert proc.stdout.readline().strip() == "computing"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert_case(case, proc.returncode, err, tmp=tmp_path)


# ------------------------------------------------------------------ what the process may hold


def test_more_runs_than_the_process_may_keep_files_open_is_refused_before_any_work(tmp_path):
    """600 seeds under ``ulimit -n 1024`` (soft and hard): every run folder's lock and metrics.jsonl stay open."""
    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    seeds = ",".join(map(str, range(600)))
    proc = _run([*TRAIN, "--seeds", seeds, "--out", tmp_path / "sweep"], _env(tmp_path), preexec_fn=limited)
    assert_case("seeds_past_open_files", proc.returncode, proc.stderr, tmp=tmp_path)
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_past_the_open_files_is_refused_before_its_runs_are_expanded(tmp_path, capsys, monkeypatch):
    """10,000 seeds under a hard limit of 1,024 files: refused on the count of runs, before any of them is
    expanded and checked (a sweep's points each a configuration) or a folder made."""
    from fedjax_pfl.commands import open_files

    monkeypatch.setattr(open_files.resource, "getrlimit", lambda which: (1024, 1024))
    monkeypatch.setattr(cli, "settle", lambda cfg: pytest.fail("the sweep's runs were expanded before the refusal"))
    code = cli.main(["--method", "fedavg", *TINY, "--seeds", ",".join(map(str, range(10_000))),
                     "--out", str(tmp_path / "sweep")])
    assert code == 2 and "10000 runs in one sweep keep about 20256 files open" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists()


def test_tensorboard_without_tensorboardx_is_refused_before_the_data_load(tmp_path, capsys, monkeypatch):
    """Refused while the configuration is checked: no data read, no folder left that would refuse the corrected
    command."""
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if it were not installed
    loads = []
    monkeypatch.setattr("fedjax_pfl.runs.experiment.load_dataset", lambda *a, **k: loads.append(a))
    out = tmp_path / "r"
    code = cli.main(["--method", "fedavg", *TINY, "--tensorboard", "--out", str(out)])
    assert_case("tensorboard_missing", code, capsys.readouterr().err, tmp=tmp_path)
    assert not loads and not out.exists()


# ------------------------------------------------------------------ where a run is resumed from


def test_a_run_resumes_from_another_working_directory(tmp_path, data_dir, monkeypatch):
    """A relative --data-dir is recorded as the folder it named, so --resume works from anywhere."""
    first, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    (first / "data").mkdir(parents=True)
    elsewhere.mkdir()
    shutil.copytree(data_dir / "mnist", first / "data" / "mnist")
    args = ["--method", "fedavg", "--dataset", "mnist", "--model", "mlr", "--num-clients", "4", "--local-epochs", "1",
            "--no-progress", "--checkpoint-every", "1"]
    monkeypatch.chdir(first)
    assert cli.main([*args, "--rounds", "1", "--data-dir", "data", "--out", "run"]) == 0
    saved = json.loads((first / "run" / "config.json").read_text())["config"]["data"]["data_dir"]
    assert saved == str(first / "data")
    monkeypatch.chdir(elsewhere)
    assert cli.main(["--out", str(first / "run"), "--resume", "--rounds", "2", "--no-progress"]) == 0
    assert [r["round"] for r in _records(first / "run")] == [1, 2]
