"""Ctrl-C during a run: the first asks the round loop to stop after the round in flight."""

from __future__ import annotations

import signal
import threading


class StopRequest:
    """While active, the first Ctrl-C asks the round loop to stop after the round in
    flight; a second one interrupts at once."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
