"""An --out folder nobody can corrupt: one writer at a time, never a folder of someone else's files, a run
stopped by SIGTERM continues exactly, and one killed during its first checkpoint's save starts over in place.

The refusals' exit codes and messages are the cases of tests/bad_input_cases.py (the reliability page's
table): each test here checks its case against that one list.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bad_input_cases import assert_case
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.engine import checkpoint
from fedjax_pfl.outputs.folder_lock import LOCK_FILE, locked
from fedjax_pfl.commands import train as cli

HERE = Path(__file__).parent
TINY = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlp", "model.hidden=[16]", "--num-clients", "6",
        "--partition", "natural", "--local-epochs", "1", "--lr", "0.05", "--no-progress"]


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _without_seconds(records):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in records]


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _train(*args, helper: str | None = None, wait: bool = True):
    command = ["-m", "fedjax_pfl.train"] if helper is None else [str(HERE / helper)]
    proc = subprocess.Popen([sys.executable, *command, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 3-round run the interrupted ones must equal, checkpointed every round, in this process."""
    out = tmp_path_factory.mktemp("whole") / "run"
    assert cli.main([*TINY, "--rounds", "3", "--checkpoint-every", "1", "--out", str(out)]) == 0
    return out


# ------------------------------------------------------------------ the lock


def test_the_lock_refuses_a_second_holder_and_leaves_nothing_behind(tmp_path):
    folder = tmp_path / "new" / "run"
    with locked(folder):
        assert (folder / LOCK_FILE).read_text().split()[0] == str(os.getpid())
        with pytest.raises(UserError, match=f"is being written by another run \\(process {os.getpid()} on "):
            with locked(folder):
                pass
    assert not (tmp_path / "new").exists()  # the folders the lock made, with nothing else written, are gone


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; from fedjax_pfl.outputs.folder_lock "
                               "import locked\nwith locked(sys.argv[1]):\n    print('held', flush=True); "
                               "os.kill(os.getpid(), signal.SIGKILL)", str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert holder.wait(timeout=60) == -signal.SIGKILL
    assert (folder / LOCK_FILE).exists()  # left behind by kill -9 ...
    with locked(folder):  # ... but the kernel released its flock
        pass
    assert not (folder / LOCK_FILE).exists() and folder.is_dir()  # (not made by this lock: it stays)


def test_two_runs_started_together_on_one_folder_one_runs_the_other_is_refused(tmp_path):
    out = tmp_path / "run"
    procs = [_train(*TINY, "--rounds", "3", "--local-epochs", "5", "--seed", str(seed), "--out", out, wait=False)
             for seed in (1, 2)]
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    winner = next(i for i, (code, _, _) in enumerate(results) if code == 0)
    refused = results[1 - winner]
    assert_case("second_writer", refused[0], refused[2], tmp=tmp_path)
    assert "loading" not in refused[1]  # refused before reading any data
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["seed"] == winner + 1  # config, records and summary are the winner's alone
    assert [r["round"] for r in _records(out)] == [1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    assert not (out / LOCK_FILE).exists()


def test_a_folder_of_other_files_is_refused_and_left_unchanged(tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "plots").mkdir(parents=True)
    (out / "notes.txt").write_text("my notes")
    (out / "metrics.csv").write_text("a,b\n1,2\n")
    (out / "plots" / "accuracy.png").write_bytes(b"not a png")
    before = _digest(out)
    code = cli.main([*TINY, "--rounds", "1", "--out", str(out)])
    assert_case("not_a_run_folder", code, capsys.readouterr().err, tmp=tmp_path)
    assert _digest(out) == before and sorted(p.name for p in out.iterdir()) == ["metrics.csv", "notes.txt", "plots"]


# ------------------------------------------------------------------ SIGTERM


def test_sigterm_mid_run_writes_an_interrupted_summary_and_resume_continues_exactly(uninterrupted, tmp_path):
    out = tmp_path / "run"
    stopped = _train("2", "TERM", *TINY, "--rounds", "3", "--out", out, helper="signal_after_round.py")
    assert_case("sigterm_mid_run", stopped.returncode, stopped.stderr, tmp=tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["after_round"] == 2
    assert checkpoint.exists(checkpoint.checkpoint_path(out))
    assert cli.main(["--out", str(out), "--resume", "--no-progress"]) == 0
    assert _without_seconds(_records(out)) == _without_seconds(_records(uninterrupted))
    assert json.loads((out / "summary.json").read_text()) == json.loads((uninterrupted / "summary.json").read_text())


# ------------------------------------------------------------------ a kill during the first checkpoint's save


def test_a_kill_during_the_first_checkpoint_save_can_be_started_over_in_place(uninterrupted, tmp_path, capsys):
    out = tmp_path / "run"
    args = [*TINY, "--rounds", "3", "--checkpoint-every", "1", "--out", str(out)]
    killed = _train(*args, helper="kill_during_checkpoint.py")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (out / "config.json").is_file() and not checkpoint.exists(checkpoint.checkpoint_path(out))
    assert any((out / "checkpoint").iterdir())  # Orbax's temporary folder, never renamed into place
    for case, argv in (("resume_without_a_checkpoint", ["--out", str(out), "--resume", "--no-progress"]),
                       ("rerun_without_a_checkpoint", args)):
        code = cli.main(argv)
        assert_case(case, code, capsys.readouterr().err, tmp=tmp_path)
    assert cli.main([*args, "--start-over"]) == 0
    assert _without_seconds(_records(out)) == _without_seconds(_records(uninterrupted))
    assert json.loads((out / "summary.json").read_text()) == json.loads((uninterrupted / "summary.json").read_text())
    assert json.loads((out / "config.json").read_text()).get("resumed") is None  # a fresh run, not a resumed one


def test_a_finished_run_without_checkpoints_is_named_finished_and_starts_over_in_place(tmp_path, capsys):
    out = tmp_path / "run"
    args = [*TINY, "--rounds", "2", "--out", str(out)]  # checkpoint_every 0: no checkpoint kept
    assert cli.main(args) == 0
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
    for case, argv in (("rerun_finished_without_checkpoints", args),
                       ("resume_finished_without_checkpoints", ["--out", str(out), "--resume", "--no-progress"])):
        code = cli.main(argv)
        assert_case(case, code, capsys.readouterr().err, tmp=tmp_path)
    assert cli.main([*args, "--start-over"]) == 0
