"""Ctrl-C and SIGTERM during a run: acknowledged at once, honoured after the round in flight (the last one too).

SIGTERM (what a batch scheduler or ``kill`` sends) is handled as Ctrl-C
(SIGINT) is. While a `StopRequest` is active (a ``with`` block in the main
thread), the first of them prints at once what will happen and sets
``requested``; the round loop stops after the call in flight (with a
checkpoint and the summary, status ``interrupted``; after the last round
the run is complete) and the command exits 128 + the signal's number (130
for Ctrl-C, 143 for SIGTERM: `exit_status`). A second one stops at once: an
`Interrupted` (a KeyboardInterrupt) in the main thread, or, when the main
thread does not answer within `ABORT_AFTER` seconds, the ``abort``
callbacks (they write the summary) and the end of the process, with the same
exit status. Outside a run's rounds (loading data, compiling)
process/stop_signals.py's `terminating` turns SIGTERM into an `Interrupted` as
Python turns Ctrl-C into a KeyboardInterrupt, so every command ends the same
way on either.

Why a watcher thread: Python runs signal handlers in the main thread only
between bytecodes, and a compiled call that holds host callbacks (the
in-round progress) keeps the main thread inside XLA until the call ends,
minutes for a long round. `signal.set_wakeup_fd` makes the C-level handler
write a byte to a pipe at once, whatever the main thread does; the watcher
reads it, prints the acknowledgement and sets ``requested``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

from tqdm import tqdm

from fedjax_pfl.process.stop_signals import NAMES, SIGNALS, Interrupted, exit_status, signals_read

ABORT_AFTER = 3.0  # seconds the main thread has to answer a second Ctrl-C before the process ends


class StopRequest:
    def __init__(self):
        self.requested = False
        self.signum: int | None = None  # the first stop signal seen
        self.in_flight: tuple[int, int] | None = None  # (last round of the call in flight, total), from 1
        self.aborts: list[Callable[[], None]] = []  # what to save when the process must end at once
        self._lock = threading.Lock()
        self._acknowledged = False
        self._handled = 0  # Ctrl-C seen by the Python handler (main thread)
        self._seen = 0  # Ctrl-C seen by the watcher
        self._active = False
        self._previous: dict | None = None
        self._previous_fd = self._pipe = None
        self.rounds_began = False  # a run's rounds have begun (the first `with` block entered)
        self.reason: str | None = None  # why the stop was requested, when not by a signal (`request`)

    @property
    def name(self) -> str:
        """How the user stopped the run: 'Ctrl-C' or 'SIGTERM'."""
        return NAMES[self.signum or signal.SIGINT]

    @property
    def exit_status(self) -> int:
        """130 after Ctrl-C, 143 after SIGTERM (`exit_status`)."""
        return exit_status(self.signum or signal.SIGINT)

    def request(self, signum: int, reason: str) -> None:
        """Stop as the first stop signal does, for ``reason`` (e.g. standard output closed), from any thread."""
        self.reason = reason
        self._first(signum)

    def acknowledgment(self) -> str:
        """What the first stop signal does, in one line."""
        again = "Ctrl-C or SIGTERM again stops at once, keeping only what was saved"
        name = self.reason or self.name
        if self.in_flight is None:
            return f"{name}: stopping before the next round ({again})"
        last, total = self.in_flight
        if last >= total:
            return f"{name}: round {total} is the last; stopping once it is done ({again})"
        return (f"{name}: stopping after round {last} of {total}, with a checkpoint and the summary; continue "
                f"later with --resume ({again})")

    def _first(self, signum: int) -> None:
        """The first stop signal, from whichever thread sees it first: set ``requested``, say so once."""
        with self._lock:
            self.requested = True
            if self._acknowledged:
                return
            self._acknowledged = True
            self.signum = signum
        tqdm.write(self.acknowledgment(), file=sys.stderr)
        sys.stderr.flush()

    def _handle(self, signum, frame):  # the Python handler: main thread, between bytecodes
        self._handled += 1
        if self._handled >= 2:
            raise Interrupted(signum)
        self._first(signum)

    def _watch(self, read_end: int) -> None:
        """The watcher thread: one byte per signal, written by the C-level handler at once."""
        for number in signals_read(read_end):
            self._seen += 1
            if self._seen == 1:
                self._first(number)
            else:
                threading.Thread(target=self._abort_unless_answered, args=(number,), daemon=True).start()

    def _abort_unless_answered(self, signum: int) -> None:
        tqdm.write(f"{NAMES[signum]} again: stopping now", file=sys.stderr)
        deadline = time.monotonic() + ABORT_AFTER
        while self._active and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._active:  # the main thread is inside a long compiled call: save what can be, and end
            for abort in self.aborts:
                abort()
            sys.stderr.flush()
            os._exit(self.exit_status)

    def __enter__(self):
        self.rounds_began = True
        if threading.current_thread() is not threading.main_thread():
            return self
        self._previous = {number: signal.signal(number, self._handle) for number in SIGNALS}
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._pipe = (read_end, write_end)
        self._active = True
        threading.Thread(target=self._watch, args=(read_end,), daemon=True, name="fedjax_pfl-ctrl-c").start()
        return self

    def __exit__(self, *exc):
        self._active = False
        if self._previous is not None:
            signal.set_wakeup_fd(self._previous_fd)
            for number, previous in self._previous.items():
                signal.signal(number, previous)
            os.close(self._pipe[1])  # the watcher reads the end of the pipe and returns
            self._previous = None
