"""A disk that fills up mid-run: the run stops with one line naming its folder, what it wrote stays readable, and
--resume once space is freed continues to the records of a run that never stopped.

The run folder lies on a small tmpfs where this machine lets the test mount one (root in a container), and the
disk is filled after round 2; elsewhere a file-size limit (RLIMIT_FSIZE, ``ulimit -f``) set in this process after
round 2 lets no file grow, which a write meets the same way (EFBIG instead of ENOSPC)."""

import contextlib
import json
import os
import resource
import signal
import subprocess
from pathlib import Path


from bad_input_cases import assert_case
from fedjax_pfl.commands import train as cli
from fedjax_pfl.engine import checkpoint
from fedjax_pfl.outputs.metrics_file import read_metrics

TINY = ["--method", "fedavg", "--dataset", "synthetic", "--model", "mlp", "model.hidden=[16]", "--num-clients", "6",
        "--partition", "natural", "--local-epochs", "1", "--lr", "0.05", "--no-progress", "--rounds", "4",
        "--rounds-per-call", "1", "--checkpoint-every", "1"]


def _records(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in read_metrics(out / "metrics.jsonl").records]


@contextlib.contextmanager
def _small_disk(folder: Path):
    """(folder on a 4 MB tmpfs, fill) or (folder, None) where mounting is not allowed."""
    folder.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(folder)],
                                                   capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Write zeros into ``folder`` until its disk has no room left -> the file written."""
    filler = folder / "filler"
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return filler


@contextlib.contextmanager
def _no_file_may_grow():
    """RLIMIT_FSIZE from now on at what the run's files hold (SIGXFSZ ignored: writes fail with EFBIG)."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    state = {}

    def limit(size: int) -> None:
        state["set"] = True
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))

    try:
        yield limit
    finally:
        if state:
            resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)


def test_a_full_disk_stops_the_run_with_one_line_and_resume_continues_exactly(tmp_path, capsys):
    whole = tmp_path / "whole"
    assert cli.main([*TINY, "--out", str(whole)]) == 0
    capsys.readouterr()
    with _small_disk(tmp_path / "disk") as mounted:
        out = tmp_path / "disk" / "run"
        with _no_file_may_grow() as limit:
            def after(rounds_done: int) -> None:  # after round 2's call, before its records are written
                if rounds_done == 2:
                    _fill(tmp_path / "disk") if mounted else limit((out / "metrics.jsonl").stat().st_size)

            code = cli.main([*TINY, "--out", str(out)], observe=after)
        assert_case("disk_full_mid_run", code, capsys.readouterr().err, tmp=tmp_path)
        saved = checkpoint.latest_round(checkpoint.checkpoint_path(out))
        assert saved == 1 or (mounted and saved == 2)
        kept = _records(out)  # every line whole: a write cut short is cut off again
        assert kept == _records(whole)[:len(kept)] and len(kept) >= saved
        assert json.loads((out / "config.json").read_text())["config"]["train"]["rounds"] == 4
        if mounted:
            (tmp_path / "disk" / "filler").unlink()  # space freed
        assert cli.main(["--out", str(out), "--resume", "--no-progress"]) == 0
        assert _records(out) == _records(whole)
        assert json.loads((out / "summary.json").read_text()) == json.loads((whole / "summary.json").read_text())
