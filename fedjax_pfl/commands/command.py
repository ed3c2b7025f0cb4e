"""What the three commands (train, reproduce, report) share: one-line errors and honest exit statuses.

- Bad input: one line ``error: ...`` that says what to do, exit 2 (a
  `UserError`, including argparse's own complaints).
- Ctrl-C or SIGTERM: a line saying what was kept, exit 130 or 143 (128 +
  the signal's number; process/stop_signals.py), within seconds; a closed
  standard output stops a command the same way, exit 141
  (commands/standard_output.py).
- A full disk: one line naming the folder and how to go on, exit 2.
- A lost process of a multi-process run: one line naming it and how to go
  on (engine/distributed.py), exit 2, at once (an ordinary exit would wait
  for the lost process at JAX's shutdown barrier).
- Anything else is a bug: one line ``error: internal error ...`` naming the
  file that holds the traceback (``error.log`` in the command's output
  folder, else a temporary file), exit 1. No traceback on the screen.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from fedjax_pfl.core.errors import UserError, one_line
from fedjax_pfl.commands.standard_output import GuardedOutput, guarded_stdout
from fedjax_pfl.process.disk_space import NoSpaceError, is_no_space
from fedjax_pfl.process.stop_signals import GRACE, NAMES, exit_status, signal_of, terminating

BAD_INPUT, INTERNAL_ERROR, INTERRUPTED, TERMINATED = 2, 1, 130, 143  # (130, 143: exit_status of SIGINT, SIGTERM)
ERROR_LOG = "error.log"


def _exit_after(seconds: float, status: int) -> None:
    """End the process with ``status`` in ``seconds`` unless it has ended by then (threads joined at exit, e.g. a
    figure being drawn, would otherwise hold a stopped command)."""
    def end():
        time.sleep(seconds)
        os._exit(status)

    threading.Thread(target=end, daemon=True, name="fedjax_pfl-exit").start()


def _lost_process(error: Exception) -> UserError | None:
    """The one-line error of a multi-process run that lost a process, naming it; None for other errors."""
    if "jax" not in sys.modules:  # (the report command never imports JAX)
        return None
    from fedjax_pfl.engine import distributed  # (imports JAX: only after the run has)

    return distributed.lost_process_error() if distributed.is_lost_process(error) else None


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad command line as a `UserError` (one line, exit 2) instead of usage text."""

    def error(self, message):
        raise UserError(f"{message} (see --help)")


def split_overrides(rest: list[str]) -> list[str]:
    """The dotted ``key.sub=value`` overrides among arguments argparse did not know; UserError for the others."""
    overrides = [t for t in rest if "=" in t and not t.startswith("-")]
    unknown = [t for t in rest if t not in overrides]
    if unknown:
        raise UserError(f"unrecognized arguments: {' '.join(unknown)} (see --help; overrides look like key.sub=value)")
    return overrides


def seed_list(text: str, flag: str = "--seeds") -> list[int]:
    """``'0,1,2'`` -> [0, 1, 2]; UserError for an empty item, a non-number or a negative seed."""
    items = [s.strip() for s in text.split(",")]
    if not all(s.isdigit() for s in items):
        raise UserError(f"{flag} takes comma-separated whole numbers >= 0, e.g. 0,1,2; got {text!r}")
    return [int(s) for s in items]


def write_error_log(folder: Path | None) -> Path:
    """The current exception's traceback in ``folder``/error.log (a temporary file when that cannot be written)."""
    text = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n{traceback.format_exc()}"
    if folder is not None:
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            with open(Path(folder) / ERROR_LOG, "a") as f:
                f.write(text)
            return Path(folder) / ERROR_LOG
        except OSError:
            pass
    with tempfile.NamedTemporaryFile("w", prefix="fedjax_pfl-error-", suffix=".log", delete=False) as f:
        f.write(text)
    return Path(f.name)


class Command:
    """Runs a command's body and turns how it ended into an exit status (see the module docstring).

    ``folder``: where error.log goes; the body sets it once it knows its
    output folder. ``output``: the guard of the command's stdout
    (commands/standard_output.py), whose ``stop`` the body sets to its run's
    `StopRequest`. ``own_process``: the command is the process (its
    ``main`` was called with no arguments), which then ends within
    `GRACE` seconds of a stop signal even when threads would hold its exit.
    """

    def __init__(self, interrupted: str, own_process: bool = False):
        self.interrupted = interrupted
        self.own_process = own_process
        self.folder: Path | None = None
        self.output: GuardedOutput | None = None

    def run(self, body: Callable[[], int]) -> int:
        try:
            with terminating(self.interrupted), guarded_stdout() as self.output:
                return body()
        except UserError as e:
            print("error: " + one_line(e), file=sys.stderr)
            return BAD_INPUT
        except KeyboardInterrupt as e:  # (``kept``: what the body says was kept, e.g. outputs/results_writer.py)
            print(f"{NAMES.get(signal_of(e), 'stopped')}: {getattr(e, 'kept', None) or self.interrupted}",
                  file=sys.stderr)
            if self.own_process:
                sys.stderr.flush()
                _exit_after(GRACE, exit_status(signal_of(e)))
            return exit_status(signal_of(e))
        except Exception as e:  # noqa: BLE001 -- a bug: one line here, the traceback in error.log
            if is_no_space(e):  # not a bug: the disk is full (a run stops with its own line: runs/run_writer.py)
                print("error: " + one_line(NoSpaceError(self.folder or Path.cwd(), one_line(e)[:300],
                                                        then="run the command again")), file=sys.stderr)
                return BAD_INPUT
            lost = _lost_process(e)
            if lost is not None:  # not a bug: a peer process is gone
                print("error: " + one_line(lost), file=sys.stderr)
                if self.own_process:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(BAD_INPUT)
                return BAD_INPUT
            log = write_error_log(self.folder)
            print(f"error: internal error ({one_line(e)}); the traceback is in {log}; please report it",
                  file=sys.stderr)
            return INTERNAL_ERROR
