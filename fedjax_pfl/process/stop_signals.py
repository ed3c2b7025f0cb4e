"""The stop signals every command handles alike: Ctrl-C (SIGINT) and SIGTERM, their names and exit statuses.

A command ended by one exits 128 + the signal's number (the shells'
convention: 130, 143). `terminating` makes SIGTERM raise `Interrupted` (a
KeyboardInterrupt) as Python makes Ctrl-C raise KeyboardInterrupt, so a
command stopped while it loads data or compiles ends the same way on either
(commands/command.py), and within seconds even inside a long compile; during
a run's rounds process/stop_request.py handles both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the stop signals, handled alike
# (SIGPIPE is never handled: it names a stop because standard output closed, commands/standard_output.py)
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGPIPE: "output closed"}
GRACE = 3.0  # seconds the main thread has to answer a stop signal before the process ends without it


def exit_status(signum: int) -> int:
    """The exit status of a command stopped by signal ``signum``: 128 + its number (shells' convention)."""
    return 128 + int(signum)


class Interrupted(KeyboardInterrupt):
    """A stop signal that ends the command at once (``signum``: which one)."""

    def __init__(self, signum: int):
        super().__init__(NAMES.get(signum, str(signum)))
        self.signum = signum


def signal_of(error: BaseException) -> int:
    """The signal behind a KeyboardInterrupt (SIGINT for Python's own)."""
    return getattr(error, "signum", signal.SIGINT)


def signals_read(read_end: int) -> Iterator[int]:
    """The stop signals (`SIGNALS`) written, one byte each, to the pipe ``read_end`` that `signal.set_wakeup_fd`
    was given, as they come; ends (closing ``read_end``) once the pipe's write end is closed."""
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:
            data = b""
        if not data:
            os.close(read_end)
            return
        yield from (number for number in data if number in SIGNALS)


@contextlib.contextmanager
def terminating(note: str = "nothing more was written"):
    """Within this block (main thread only) Ctrl-C and SIGTERM raise `Interrupted`, and return within `GRACE`
    seconds even when the main thread is inside a long compile or compiled call (where Python runs no handler):
    a watcher thread, woken at once through `signal.set_wakeup_fd`, then prints the signal's name and ``note``
    and ends the process with the signal's exit status."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled, ended = [0], threading.Event()  # signals the main thread has raised; the block has ended

    def handle(signum, frame):
        handled[0] += 1
        raise Interrupted(signum)

    def watch(read_end: int) -> None:
        for seen, signum in enumerate(signals_read(read_end), start=1):
            deadline = time.monotonic() + GRACE
            while handled[0] < seen and not ended.is_set() and time.monotonic() < deadline:
                time.sleep(0.05)
            if handled[0] < seen and not ended.is_set():
                sys.stderr.write(f"{NAMES[signum]}: {note}; stopped at once, the computation in flight would not "
                                 "give way\n")
                sys.stderr.flush()
                os._exit(exit_status(signum))

    previous = {number: signal.signal(number, handle) for number in SIGNALS}
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=watch, args=(read_end,), daemon=True, name="fedjax_pfl-stop-watch").start()
    try:
        yield
    finally:
        ended.set()
        signal.set_wakeup_fd(previous_fd)
        for number, handler in previous.items():
            signal.signal(number, handler)
        os.close(write_end)  # the watcher reads the end of the pipe and returns
