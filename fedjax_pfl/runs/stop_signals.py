"""The stop signals every command handles alike: Ctrl-C (SIGINT) and SIGTERM, their names and exit statuses.

A command ended by one exits 128 + the signal's number (the shells'
convention: 130, 143). `terminating` makes SIGTERM raise `Interrupted` (a
KeyboardInterrupt) as Python makes Ctrl-C raise KeyboardInterrupt, so a
command stopped while it loads data or compiles ends the same way on either
(commands/command.py); during a run's rounds runs/stop_request.py handles both.
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the stop signals, handled alike
NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


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


@contextlib.contextmanager
def terminating():
    """Within this block (main thread only) SIGTERM raises `Interrupted`, as Ctrl-C raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
