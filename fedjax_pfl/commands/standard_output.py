"""A command's standard output when it cannot be written: its reader went away, or its disk is full.

`guarded_stdout(stop)` puts a guard in front of ``sys.stdout`` for the
command. The first write (or flush) that fails points file descriptor 1 at
/dev/null, so nothing buffered fails again (at exit neither), and then:

- before a run's rounds begin: a closed pipe (``| head -1`` has read its
  line) ends the command at once as SIGTERM would, exit 141 (128 + SIGPIPE);
  another failure (``> /dev/full``) is a `UserError` naming it (exit 2). Raised
  from the main thread only; nothing was trained yet;
- once the rounds have begun (``stop``, the run's `StopRequest`, entered):
  the run stops as after SIGTERM, after the round in flight with a checkpoint
  and the summary, and the command exits 141; one line on stderr says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
from typing import Iterator

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.process.stop_request import StopRequest
from fedjax_pfl.process.stop_signals import Interrupted


class GuardedOutput:
    """``stream`` (the command's stdout) whose failed writes are handled as the module docstring says."""

    def __init__(self, stream, stop: StopRequest | None):
        self._stream, self.stop = stream, stop
        self.failed: OSError | None = None

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        if self.failed is None:
            try:
                return self._stream.write(text)
            except OSError as e:
                self._fail(e)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self._stream.flush()
            except OSError as e:
                self._fail(e)

    def _fail(self, error: OSError) -> None:
        self.failed = error
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        closed = isinstance(error, BrokenPipeError) or error.errno in (errno.EPIPE, errno.ECONNRESET)
        reason = "output closed" if closed else f"standard output failed ({error.strerror or error})"
        if self.stop is not None and self.stop.rounds_began:
            self.stop.request(signal.SIGPIPE, reason)
        elif threading.current_thread() is threading.main_thread():
            if closed:
                raise Interrupted(signal.SIGPIPE)
            raise UserError(f"cannot write to standard output ({error.strerror or error}); send it where it can be "
                            "written (a file on a disk with room, or /dev/null)")
        elif self.stop is not None:
            self.stop.request(signal.SIGPIPE, reason)


@contextlib.contextmanager
def guarded_stdout(stop: StopRequest | None = None) -> Iterator[GuardedOutput]:
    """``sys.stdout`` guarded for the block (see the module docstring); ``stop``: the run's, when it has one (may
    be set later on the yielded guard)."""
    guard = GuardedOutput(sys.stdout, stop)
    previous, sys.stdout = sys.stdout, guard
    try:
        yield guard
    finally:
        sys.stdout = previous
        if guard.failed is not None:
            with contextlib.suppress(OSError, ValueError):
                previous.flush()  # (into /dev/null now: nothing left to fail at exit)
