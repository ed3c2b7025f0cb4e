"""A sweep's many runs finish saying what they do: their records first (all of them, whatever stops the command
meanwhile), then their figures one run after another with a progress line at least every few seconds, and a stop
while they are drawn ends with one line naming exactly the runs that have their figures, as their folders show."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_pfl.outputs import results_writer

HERE = Path(__file__).parent
TINY = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlr", "--num-clients", "6", "--partition",
        "natural", "--local-epochs", "1", "--rounds", "2", "--no-progress"]


class Clock:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeResults:
    """A run's figures, drawn at a given time of the fake clock."""

    def __init__(self, out: Path, clock: Clock, ready_at: float):
        self.out, self.clock, self.ready_at, self.cancelled = out, clock, ready_at, False

    @property
    def figures_done(self):
        return self.cancelled or self.clock() >= self.ready_at

    @property
    def figures_drawn(self):
        return not self.cancelled and self.clock() >= self.ready_at

    def cancel_figures(self):
        self.cancelled = self.clock() < self.ready_at

    def wait_figures(self):
        return []


def test_figures_of_many_runs_report_at_least_every_interval(monkeypatch, tmp_path):
    clock = Clock()
    pending = [FakeResults(tmp_path / f"seed{i}", clock, 7.0 * (i + 1)) for i in range(12)]  # 7 s a run
    monkeypatch.setattr(results_writer, "unwaited", lambda: pending)
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: True)
    lines = []

    def show(line):
        lines.append((clock.now, line))

    def sleep(seconds):
        clock.now += 1.5

    monkeypatch.setattr(results_writer.time, "sleep", sleep)
    results_writer.draw_figures(tmp_path, show, interval=10.0, clock=clock)
    times = [t for t, _ in lines]
    assert times[0] == 0.0 and times[-1] >= 84.0 and "all 12 runs drawn" in lines[-1][1]
    assert all(b - a <= 10.0 + 1.5 for a, b in zip(times, times[1:])), lines  # (the poll's step past the interval)
    assert any("runs drawn, about" in line for _, line in lines[1:-1])


def test_a_stop_while_drawing_names_the_runs_that_have_their_figures(monkeypatch, tmp_path):
    clock = Clock()
    pending = [FakeResults(tmp_path / f"seed{i}", clock, 2.0 * (i + 1)) for i in range(8)]
    monkeypatch.setattr(results_writer, "unwaited", lambda: pending)
    monkeypatch.setattr(results_writer, "matplotlib_available", lambda: True)

    def sleep(seconds):
        clock.now += 1.0
        if clock.now >= 7.0:  # seeds 0-2 drawn
            raise KeyboardInterrupt

    monkeypatch.setattr(results_writer.time, "sleep", sleep)
    with pytest.raises(KeyboardInterrupt) as stopped:
        results_writer.draw_figures(tmp_path, lambda line: None, clock=clock)
    assert [r.cancelled for r in pending] == [False] * 3 + [True] * 5
    assert stopped.value.kept == (f"every one of the 8 runs has its records (metrics.jsonl, summary.json, "
                                  f"metrics.csv); 3 have their figures too (seed0-seed2); python -m fedjax_pfl.report "
                                  f"{tmp_path} --redraw --out {tmp_path}/report draws the rest")


def test_records_of_every_run_are_written_when_a_stop_comes_meanwhile(tmp_path):
    class Writer:
        def __init__(self, i):
            self.files, self.results, self.calls = tmp_path / f"seed{i}", FakeResults(tmp_path, Clock(), 1), 0

        def finish(self, wait_figures):
            self.calls += 1
            if self.files.name == "seed2" and self.calls == 1:
                raise KeyboardInterrupt  # (Ctrl-C while its summary was written: written again, whole)
            return {"status": "finished", "run": self.files.name}

    writers = [Writer(i) for i in range(5)]
    with pytest.raises(KeyboardInterrupt) as stopped:
        results_writer.finish_records(writers, lambda line: None)
    assert [w.calls for w in writers] == [1, 1, 2, 1, 1]
    assert stopped.value.kept.startswith("every one of the 5 runs has its records")


def test_a_sweep_stopped_between_programs_names_the_runs_with_records(tmp_path):
    folders = [tmp_path / f"seed{i}" for i in range(10)]
    assert results_writer.stopped_between(folders, 4, tmp_path) == (
        "stopped: seed0-seed3 have their records; seed4-seed9 did not start (their folders are not made)")


def test_named_runs_group_consecutive_seeds(tmp_path):
    folders = [tmp_path / p for p in ("seed0", "seed1", "seed2", "seed5", "lr0.1/seed0", "lr0.1/seed1", "other")]
    assert results_writer.named(folders, tmp_path) == "seed0-seed2, seed5, lr0.1/seed0-lr0.1/seed1, other"


def test_a_sweep_stopped_while_drawing_says_exactly_which_folders_have_figures(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, str(HERE / "interrupt_while_drawing.py"), "3", "INT", *TINY, "--seeds",
                           "0,1,2,3,4,5,6,7", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 130, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    folders = sorted((out / f"seed{i}" for i in range(8)), key=lambda p: int(p.name[4:]))
    assert all(json.loads((f / "summary.json").read_text())["status"] == "finished" for f in folders)
    drawn = [f for f in folders if (f / "plots" / "accuracy.png").is_file()]
    assert 3 <= len(drawn) < 8
    assert line == (f"Ctrl-C: every one of the 8 runs has its records (metrics.jsonl, summary.json, metrics.csv); "
                    f"{len(drawn)} have their figures too ({results_writer.named(drawn, out)}); python -m fedjax_pfl.report "
                    f"{out} --redraw --out {out}/report draws the rest"), proc.stderr[-2000:]
    assert "figures: drawing those of 8 runs" in proc.stdout
