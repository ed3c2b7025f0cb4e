"""Several training commands at once, each its own process: ``reproduce --jobs N``.

One cell of a paper table rarely fills a large GPU (a 10-client CNN round
uses a few percent of an H200), so a table runs faster as several cells side
by side. `run_side_by_side` starts ``python -m fedjax_pfl.train ARGV`` for up
to ``width`` cells at a time, each writing its own run folder, with its
output (the progress lines and any error) in ``logs/<cell>.log``, and starts
the next cell as one finishes. It prints a line when a cell starts and when
it ends. Ctrl-C sends SIGINT to every running cell, which stops after its
round in flight with a checkpoint (as a single run does), and waits for them:
the same command continues them with ``--resume``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from fedjax_pfl.process.stop_signals import exit_status, signal_of

TRAIN_MODULE = "fedjax_pfl.train"
POLL_SECONDS = 0.5


class Job(NamedTuple):
    label: str  # the cell's name, e.g. "fedavg-cifar10_E5/seed0"
    argv: list[str]  # the training command's arguments (after ``python -m fedjax_pfl.train``)


def log_path(logs: Path, label: str) -> Path:
    """``logs``/<label with '/' as '_'>.log.

    Examples:
        >>> log_path(Path("out/logs"), "fedavg-synth/seed0").as_posix()
        'out/logs/fedavg-synth_seed0.log'
    """
    return logs / f"{label.replace('/', '_').replace(' ', '_')}.log"


def run_side_by_side(jobs: list[Job], width: int, logs: Path) -> tuple[list[str], int]:
    """Run ``jobs``, ``width`` at a time -> (labels of the jobs that failed, 130 or 143 if stopped by Ctrl-C or
    SIGTERM, else 0)."""
    logs.mkdir(parents=True, exist_ok=True)
    pending, running, failed = list(jobs), {}, []
    try:
        while pending or running:
            while pending and len(running) < width:
                job = pending.pop(0)
                path = log_path(logs, job.label)
                log = open(path, "w")
                # its own session: a Ctrl-C at the terminal reaches this process, which passes it on once
                proc = subprocess.Popen([sys.executable, "-m", TRAIN_MODULE, *job.argv], stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                running[proc] = (job.label, log, path)
                print(f"started {job.label} (log: {path})", flush=True)
            time.sleep(POLL_SECONDS)
            for proc in [p for p in running if p.poll() is not None]:
                label, log, path = running.pop(proc)
                log.close()
                if proc.returncode == 0:
                    print(f"finished {label}", flush=True)
                else:
                    failed.append(label)
                    print(f"failed {label} (exit {proc.returncode}; see {path})", flush=True)
    except KeyboardInterrupt as e:
        for proc in running:
            proc.send_signal(signal.SIGINT)
        for proc, (label, log, path) in running.items():
            proc.wait()
            log.close()
            print(f"stopped {label} (exit {proc.returncode}; see {path})", flush=True)
        return failed, exit_status(signal_of(e))
    return failed, 0
