"""tools/run_records.py: a device visit's run records packed there and landed here, and the plan made again."""

import csv
import json
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tools/ is a folder of scripts

from fedjax_pfl.core.errors import UserError  # noqa: E402
from fedjax_pfl.outputs import metrics_file, run_folder  # noqa: E402
from fedjax_pfl.cells import reproduce  # noqa: E402
from signal_after_round import signal_after  # noqa: E402
from test_run_plan import _tiny  # noqa: E402
from tools import run_records  # noqa: E402


def _accuracies(folder) -> list[float]:
    return [r["accuracy"] for r in run_folder.read_records(folder)]


def test_a_visit_cut_mid_cell_resumes_to_the_numbers_of_an_uninterrupted_run_and_lands_here(tmp_path, monkeypatch,
                                                                                            capsys):
    table = _tiny(tmp_path, monkeypatch)
    out = tmp_path / "table"
    assert reproduce.main(["--table-file", str(table), "--out", str(out), "--plan-for-seconds", "700",
                           "--device-kind", "tiny-device", "--seeds", "0"]) == 0
    plan = json.loads((out / "run_plan.json").read_text())
    # the headline row (global) first, 25 s + 4 rounds x 2 s; one command holds both
    assert plan["run_list"] == ["global-synth/seed0", "local-synth/seed0"] and len(plan["commands"]) == 1
    assert [s["cells"] for s in plan["commands"][0]["steps"]] == [["global-synth/seed0"], ["local-synth/seed0"]]
    assert all(s["seconds"] == pytest.approx(25 + 4 * s["seconds_per_round"]) for s in plan["commands"][0]["steps"])
    script = (out / "run_plan.sh").read_text()
    assert "cells='global-synth/seed0;local-synth/seed0'" in script  # ';' between programs
    assert subprocess.run(["bash", "-n", out / "run_plan.sh"]).returncode == 0
    too_short = subprocess.run(["bash", out / "run_plan.sh", "100"], capture_output=True, text=True)
    assert too_short.returncode == 2 and "SECONDS too small" in too_short.stderr
    assert "Planned runs (tiny-device" in (out / "table.md").read_text()
    # the plan's command, as the script runs it in a work folder of its own: cut after the first cell's round 2
    line = next(ln for ln in script.splitlines() if ln.startswith("timeout "))
    argv = shlex.split(line.split('"$python" -m fedjax_pfl.reproduce ', 1)[1])
    work = tmp_path / "work"
    cells = shlex.split(next(ln for ln in script.splitlines() if ln.startswith("cells=")))[0].split("=", 1)[1]
    argv = [a.replace("$work", str(work)).replace("$cells", cells) for a in argv]
    assert reproduce.main(argv, observe=signal_after(2, "INT")) == 130
    assert json.loads((work / "runs/global-synth/seed0/summary.json").read_text())["status"] == "interrupted"
    assert run_records.main(["pack", str(work), str(tmp_path / "first.tar.gz")]) == 0
    capsys.readouterr()
    assert reproduce.main(argv) == 0
    assert "global-synth/seed0: resume" in capsys.readouterr().out
    assert run_records.main(["pack", str(work), str(tmp_path / "second.tar.gz")]) == 0
    with tarfile.open(tmp_path / "second.tar.gz") as tar:
        names = sorted(tar.getnames())
    compact = ("config.json", "summary.json", metrics_file.COMPACT)  # finished runs come back compact
    assert names == sorted(f"runs/{c}/{f}" for c in plan["run_list"] for f in compact)
    assert (work / "runs/global-synth/seed0/checkpoint").is_dir()  # left behind
    # the same cell run straight through, elsewhere
    straight = tmp_path / "straight"
    assert reproduce.main(["--table-file", str(table), "--out", str(straight), "--cells", "global-synth/seed0",
                           "--no-progress", "train.client_mapping=vmap"]) == 0
    assert _accuracies(work / "runs/global-synth/seed0") == _accuracies(straight / "runs/global-synth/seed0")
    capsys.readouterr()
    # here: the first archive holds the cut run (not landed), the second the finished ones
    assert run_records.main(["land", str(table), str(tmp_path / "first.tar.gz"), str(tmp_path / "second.tar.gz"),
                             "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "landed 2 run(s)" in printed and "cut before their end" not in printed  # (the second finished it)
    landed = out / "runs/global-synth/seed0"
    assert sorted(p.name for p in landed.iterdir()) == sorted(compact)
    assert _accuracies(landed) == _accuracies(straight / "runs/global-synth/seed0")
    rows = {r["method"]: r for r in csv.DictReader(open(out / "table.csv"))}
    assert rows["global"]["status"] == "1 finished, 1 not run" and float(rows["global"]["paper"]) == pytest.approx(0.6)
    replanned = json.loads((out / "run_plan.json").read_text())  # planned again: all the seeds, seed 1 left
    assert replanned["run_list"] == ["global-synth/seed1", "local-synth/seed1"] and replanned["plan_for_seconds"] == 700
    assert "Expected to finish 2 cell(s): global-synth/seed1, local-synth/seed1" in (out / "table.md").read_text()
    # landing the same records again keeps what is here
    assert run_records.main(["land", str(table), str(tmp_path / "second.tar.gz"), "--out", str(out)]) == 0
    assert "landed 0 run(s); 2 already here" in capsys.readouterr().out


def test_a_records_archive_holding_anything_else_is_refused(tmp_path):
    bad = tmp_path / "records.tar.gz"
    (tmp_path / "ckpt").write_text("x")
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "ckpt", arcname="runs/fedas-beta0.1_P0.6/seed0/checkpoints/1/state")
    with pytest.raises(UserError, match="is not a run record"):
        run_records.land([tmp_path], tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("argv, message", [
    (["land", "no_such_table", "x.tar.gz"], "no_such_table"),
    (["land", "fedas_table3", "nowhere.tar.gz", "--out", "{tmp}/o"], "no such records archive"),
    (["unpack"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(argv, message, tmp_path, capsys):
    assert run_records.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
