"""What a run shows while it goes: what is compiling and for how long, and a bar that moves inside rounds.

- Before a call that compiles, one line (stdout) says what compiles; while
  XLA works the bar counts the seconds; when the call's program runs, one
  line gives the compile time (from jax.monitoring's compile events).
- Inside a round (single-round calls carry the engine's in-round events,
  engine/round_progress.py) the bar moves with the clients' local steps and
  says where the round is: ``round 3/40: 5/12 clients, local step 120/705``
  (or ``statistics pass 64/380`` for a Fisher trace or class means, and the
  server step and evaluation once every client is done). Events are counted
  as they come (a runtime thread calls `event`); the bar is redrawn at most 4
  times a second on a terminal, every 5 s in a log, and at least that often
  while a call runs (a heartbeat thread), so the elapsed time always moves.
- The estimate of the time left uses the rate since compilation ended.
Nothing here changes what a run computes; with the bar off only the compile
lines are printed.
"""

from __future__ import annotations

import sys
import threading
import time

import jax
from jax import monitoring
from tqdm import tqdm

from fedjax_pfl.engine.round_progress import Event

COMPILE_EVENTS = "/jax/core/compile/"  # jax.monitoring duration events of tracing, lowering and XLA compiling
TERMINAL_INTERVAL, LOG_INTERVAL = 0.25, 5.0  # seconds between redraws

_active: "RunProgress | None" = None
_listening = False


def _compile_duration(event: str, duration: float, **kwargs) -> None:
    progress = _active
    if progress is not None and event.startswith(COMPILE_EVENTS):
        progress.compile_seconds += duration


def _listen_to_compiles() -> None:
    """Register the one jax.monitoring listener of this process (it forwards to the active display)."""
    global _listening
    if not _listening:
        monitoring.register_event_duration_secs_listener(_compile_duration)
        _listening = True


class RunProgress:
    """The display of one run (or one chunk of a sweep): ``total`` rounds, ``done`` of them already;
    ``clients`` clients train per round (all experiments of a chunk together)."""

    def __init__(self, total: int, done: int, clients: int, enabled: bool = True):
        terminal = sys.stderr.isatty()
        self.enabled, self.total, self.clients = enabled, total, max(clients, 1)
        self.what = f" on {jax.devices()[0].device_kind} ({jax.default_backend()})"
        self.interval = TERMINAL_INTERVAL if terminal else LOG_INTERVAL
        self.bar = tqdm(total=total, initial=done, desc="rounds", unit="round", disable=not enabled, file=sys.stderr,
                        mininterval=self.interval, smoothing=0, dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total_fmt} [{elapsed}<{remaining}"
                                   "{postfix}]")
        self._lock = threading.Lock()
        self._drawn_at = 0.0
        self.first = self.stop = done
        self.position = float(done)
        self.clients_done, self.step, self.steps, self.width = 0, 0, 0, 0
        self.in_call = self.compiling = False
        self.compile_seconds, self._compile_began = 0.0, 0.0
        self.postfix = ""

    # ------------------------------------------------------------- the loop's calls
    def call_starts(self, first: int, stop: int, compiling: bool, count: int) -> None:
        """A call of rounds ``first+1 .. stop`` (counted from 1) starts; ``compiling``: its program is new."""
        global _active
        with self._lock:
            self.first, self.stop, self.position = first, stop, float(first)
            self.clients_done = self.step = self.steps = self.width = 0
            self.compiling, self.compile_seconds, self._compile_began = compiling, 0.0, time.perf_counter()
            self.in_call = True
        _listen_to_compiles()
        _active = self
        if compiling:
            self.write(f"compiling {count} round{'s' if count > 1 else ''} per call{self.what} ...", sys.stdout)
        if self.enabled:
            threading.Thread(target=self._heartbeat, daemon=True, name="fedjax_pfl-progress").start()

    def call_done(self, stop: int, accuracy: float | None) -> None:
        """The call returned: the bar stands at ``stop`` rounds; ``accuracy``: the latest evaluation's, if any."""
        self._compiled()
        with self._lock:
            self.in_call = False
            self.postfix = f"acc={accuracy:.4f}" if accuracy is not None else ""
            self.first = self.stop = stop
            self.position = float(stop)
            self._draw()

    def event(self, event: Event) -> None:
        """An in-round event (called on a runtime thread while the round runs)."""
        self._compiled()
        with self._lock:
            if event.kind == "client":
                self.clients_done += event.width
                self.step = self.steps = self.width = 0
            elif event.kind == "step":
                self.step, self.steps, self.width = event.done, event.total, event.width
            if self.stop != self.first + 1:  # a fused call: no position inside it
                return
            fraction = (self.clients_done + self.width * self.step / max(self.steps, 1)) / self.clients
            self.position = max(self.position, self.first + min(1.0, fraction))
            done = min(self.clients_done, self.clients)
            where = (f", local step {event.done}/{event.total}" if event.kind == "step" else
                     f", statistics pass {event.done}/{event.total}" if event.kind == "pass" else "")
            self.postfix = f"round {self.stop}/{self.total}: {done}/{self.clients} clients{where}"
            if time.monotonic() - self._drawn_at >= self.interval:
                self._draw()

    def close(self) -> None:
        global _active
        with self._lock:
            self.in_call = False
        if _active is self:
            _active = None
        self.bar.close()

    def write(self, line: str, stream=sys.stderr) -> None:
        """A line above the bar."""
        tqdm.write(line, file=stream)
        stream.flush()

    # ------------------------------------------------------------------ inside
    def _draw(self) -> None:
        """(lock held) Show ``position`` and ``postfix`` now."""
        if not self.enabled:
            return
        self.bar.n = self.position
        self.bar.set_postfix_str(self.postfix, refresh=False)
        self._drawn_at = time.monotonic()
        self.bar.refresh()

    def _heartbeat(self) -> None:
        """While a call runs, redraw at least every interval (the elapsed time moves), saying what happens
        when no event comes: compiling, or the server step and the evaluation after the last client."""
        while True:
            time.sleep(min(1.0, self.interval))
            with self._lock:
                if not self.in_call:
                    return
                if self.compiling:
                    self.postfix = f"compiling {time.perf_counter() - self._compile_began:.0f} s"
                elif self.stop == self.first + 1 and self.clients_done >= self.clients:
                    self.postfix = (f"round {self.stop}/{self.total}: all {self.clients} clients done; server step "
                                    "and evaluation")
                if time.monotonic() - self._drawn_at >= (min(1.0, self.interval) if self.compiling else self.interval):
                    self._draw()

    def _compiled(self) -> None:
        """The call's program runs (its first event, or its end): say how long compiling took (tracing,
        lowering and XLA, as jax.monitoring timed them) and leave it out of the rate."""
        if not self.compiling:
            return
        with self._lock:
            if not self.compiling:
                return
            self.compiling = False
            seconds = self.compile_seconds
            single = self.stop == self.first + 1
            self.postfix = f"round {self.stop}/{self.total}" if single else f"rounds {self.first + 1}-{self.stop}"
            if self.enabled:
                self.bar.start_t += seconds  # the estimate of the time left counts rounds, not compiling
        self.write(f"compiled in {seconds:.1f} s", sys.stdout)
