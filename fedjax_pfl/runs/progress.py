"""What a run shows while it goes: what is compiling and for how long, and a bar that moves inside rounds.

- Before a call that compiles, one line (stdout) says what compiles; while
  JAX traces and XLA compiles the bar counts the seconds; when the program
  is compiled (jax.monitoring's backend-compile event, or the round's first
  event), one line gives the compile time, and the bar says where the round
  is from then on.
- Inside a round (single-round calls carry the engine's in-round events,
  engine/round_progress.py) the bar moves with the clients' local steps and
  says where the round is: ``round 3/40: 5/12 clients, local step 120/705``
  (or ``statistics pass 64/380`` for a Fisher trace or class means, and the
  server step and evaluation once every client is done). On several devices
  each device reports its own clients; the clients in flight count once per
  device. Events are counted as they come (a runtime thread calls `event`);
  the bar is redrawn at most 4 times a second on a terminal, every 5 s in a
  log, and at least that often while a call runs (a heartbeat thread).
- The time left (outputs/wall_time.py) counts computing only: the elapsed
  time is the wall clock and never jumps; compile time is left out of the
  rate. The estimate lines (before the first round, after it, and when it
  moves) are printed with the bar off too.
Nothing here changes what a run computes; without the bar only the compile and estimate lines print.
"""

from __future__ import annotations

import sys
import threading
import time

import jax
from jax import monitoring
from tqdm import tqdm

from fedjax_pfl.engine.round_progress import Event
from fedjax_pfl.outputs.wall_time import WallTimeEstimate, clock

COMPILE_EVENTS = "/jax/core/compile/"  # jax.monitoring duration events of tracing, lowering and XLA compiling
TRACE_EVENT = COMPILE_EVENTS + "jaxpr_trace_duration"  # a program was traced: its lowering and compile follow
BACKEND_EVENT = COMPILE_EVENTS + "backend_compile_duration"  # XLA compiled it (or read it from the cache): it runs
TERMINAL_INTERVAL, LOG_INTERVAL = 0.25, 5.0  # seconds between redraws

_active: "RunProgress | None" = None
_listening = False


def _compile_duration(event: str, duration: float, **kwargs) -> None:
    progress = _active
    if progress is not None and event.startswith(COMPILE_EVENTS):
        progress.compile_event(event, duration)


def _listen_to_compiles() -> None:
    """Register the one jax.monitoring listener of this process (it forwards to the active display)."""
    global _listening
    if not _listening:
        monitoring.register_event_duration_secs_listener(_compile_duration)
        _listening = True


def where() -> str:
    """The devices a run computes on, e.g. 'cpu x2', 'NVIDIA H200'."""
    devices = jax.devices()
    return f"{devices[0].device_kind}" + (f" x{len(devices)}" if len(devices) > 1 else "")


class RunProgress:
    """The display of one run (or one chunk of a sweep): ``total`` rounds, ``done`` of them already;
    ``clients`` clients train per round (all experiments of a chunk together), dealt over ``devices``;
    ``timed_round``: the seconds of a round timed before the first (the client mapping's), if any."""

    def __init__(self, total: int, done: int, clients: int, enabled: bool = True, devices: int = 1,
                 timed_round: float | None = None):
        terminal = sys.stderr.isatty()
        self.enabled, self.total, self.clients, self.devices = enabled, total, max(clients, 1), max(devices, 1)
        self.what = f" on {jax.devices()[0].device_kind} ({jax.default_backend()})"
        self.estimate = WallTimeEstimate(total, done, where(), timed_round)
        self.interval = TERMINAL_INTERVAL if terminal else LOG_INTERVAL
        self.bar = tqdm(total=total, initial=done, desc="rounds", unit="round", disable=not enabled, file=sys.stderr,
                        mininterval=self.interval, smoothing=0, dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total_fmt} [{elapsed}{postfix}]")
        self._lock = threading.Lock()
        self._drawn_at = 0.0
        self.first = self.stop = done
        self.position = float(done)
        self.clients_done, self.step, self.steps, self.width = 0, 0, 0, 0
        self.in_call = self.compiling = self._reported = self._started = self._compiles = False
        self.compile_seconds, self._compile_began, self._call_began = 0.0, 0.0, 0.0
        self._last_done: float | None = None
        self._compile_total = self._compile_at_done = 0.0  # every compile of the run, and up to the last call's end
        self.postfix = ""  # where the round is (the bar adds the time left before it)

    # ------------------------------------------------------------- the loop's calls
    def call_starts(self, first: int, stop: int, compiling: bool, count: int) -> None:
        """A call of rounds ``first+1 .. stop`` (counted from 1) starts; ``compiling``: its program is new."""
        global _active
        if not self._started:
            self._started = True
            for line in self.estimate.before_first_round():
                self.write(line, sys.stdout)
        with self._lock:
            self.first, self.stop, self.position = first, stop, float(first)
            self.clients_done = self.step = self.steps = self.width = 0
            self._call_began = self._compile_began = time.perf_counter()
            self.compiling, self.compile_seconds, self._reported = compiling, 0.0, False
            self._compiles = compiling  # (whether this call reports its compile time)
            self.postfix = self._round_text()
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
            now = time.perf_counter()  # (the time since the last call ended counts: records, checkpoints, figures)
            since = self._last_done if self._last_done is not None else self._call_began
            compiled = self._compile_total - self._compile_at_done
            lines = self.estimate.call_done(stop - self.first, now - since, max(compiled, self.compile_seconds))
            self._last_done, self._compile_at_done = now, self._compile_total
            self.postfix = f"acc={accuracy:.4f}" if accuracy is not None else ""
            self.first = self.stop = stop
            self.position = float(stop)
            self._draw()
        for line in lines:
            self.write(line, sys.stdout)

    def compile_event(self, event: str, seconds: float) -> None:
        """A jax.monitoring compile event of ``seconds``: a traced program starts compiling, a compiled one
        runs (called on the thread that compiles)."""
        with self._lock:
            self.compile_seconds += seconds
            self._compile_total += seconds
            if not self.in_call:
                return
            if event == TRACE_EVENT and not self.compiling:
                self.compiling, self._compile_began = True, time.perf_counter() - seconds
                self._compiles = True
        if event == BACKEND_EVENT:
            self._compiled(report=False)  # (another program may follow: the line waits for the round's first event)

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
            in_flight = self.devices * self.width * self.step / max(self.steps, 1)  # each device has its own
            fraction = (self.clients_done + in_flight) / self.clients
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
    def _round_text(self) -> str:
        """(lock held) Which round or rounds the call in flight runs."""
        single = self.stop == self.first + 1
        return f"round {self.stop}/{self.total}" if single else f"rounds {self.first + 1}-{self.stop}/{self.total}"

    def _left_text(self) -> str:
        """(lock held) '~MM:SS left' from the computing seconds so far, or '' before there are any."""
        now = time.perf_counter()
        computing = 0.0
        if self.in_call:
            compiling = now - self._compile_began if self.compiling else 0.0
            computing = max(0.0, now - self._call_began - self.compile_seconds - compiling)
        left = self.estimate.left(self.position, computing)
        return "" if left is None else f"~{clock(left)} left"

    def _draw(self) -> None:
        """(lock held) Show ``position``, the time left and ``postfix`` now."""
        if not self.enabled:
            return
        self.bar.n = self.position
        self.bar.set_postfix_str(", ".join(t for t in (self._left_text(), self.postfix) if t), refresh=False)
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
                elif self.postfix.startswith("compiling"):  # compiled; no event of the round yet
                    self.postfix = f"{self._round_text()}: running"
                elif self.stop == self.first + 1 and self.clients_done >= self.clients:
                    self.postfix = (f"round {self.stop}/{self.total}: all {self.clients} clients done; server step "
                                    "and evaluation")
                if time.monotonic() - self._drawn_at >= (min(1.0, self.interval) if self.compiling else self.interval):
                    self._draw()

    def _compiled(self, report: bool = True) -> None:
        """A program of the call was compiled (``report`` False) or the call's program runs (its first event, or
        its end): the bar leaves "compiling"; once per call that compiled, with ``report``, say how long
        compiling took (tracing, lowering and XLA, as jax.monitoring timed them)."""
        if not self.compiling and (self._reported or not self._compiles):
            return
        with self._lock:
            if self.compiling:
                self.compiling = False
                self.postfix = f"{self._round_text()}: running"
                self._draw()
            report = report and self._compiles and not self._reported
            self._reported = self._reported or report
            seconds = self.compile_seconds
        if report:
            self.write(f"compiled in {seconds:.1f} s", sys.stdout)
