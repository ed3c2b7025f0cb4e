"""How long a run will take on this machine: an estimate from its own measured rounds, refined as it runs.

Before the first round the run says what the estimate will rest on: the
client mapping's timed round when ``train.client_mapping=auto`` timed one
(engine/mapping_choice.py; then the estimate is given at once), else round 1
of the run itself. After each compiled call the seconds spent computing
(the call's wall time less its compile time, from jax.monitoring) give the
seconds per round; the rounds left times that is the time left. The estimate
is printed after the first measured call and again whenever the time left
moves by more than `REPRINT_SHIFT` of it (and a minute), so a log shows it
too; the progress bar shows it continuously. A run estimated at more than
`HINT_AFTER` seconds also gets one line naming what makes it shorter.
This module only computes the lines (from the seconds it is given; it reads
no clock); runs/progress.py times the calls and prints them.
"""

from __future__ import annotations

HINT_AFTER = 120.0  # seconds: shorter runs get no hint
MIN_PROGRESS = 0.05  # of a round: before a round was measured, the bar's estimate waits for this much of the first
REPRINT_SHIFT = 0.25  # a refined estimate is printed when the time left moves by this share of it ...
REPRINT_SECONDS = 60.0  # ... and by at least this many seconds
SHORTER = ("to make it shorter: fewer --rounds or --local-epochs, a smaller --join-ratio or --num-clients, "
           "a smaller --model, or a GPU")


def duration(seconds: float) -> str:
    """``seconds`` in words a reader takes in at once: '4.5 s', '150 s', '12 min', '1 h 40 min'."""
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 600:
        return f"{seconds:.0f} s"
    minutes = int(seconds / 60 + 0.5)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def clock(seconds: float) -> str:
    """``seconds`` as a bar shows time: 'MM:SS', or 'H:MM:SS' from an hour on."""
    seconds = int(max(0.0, seconds) + 0.5)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


class WallTimeEstimate:
    """The estimate of one run (or one chunk of a sweep) of ``total`` rounds, ``done`` of them already, on
    ``where`` (e.g. 'cpu (2 devices)'). ``timed_round``: seconds of a round measured before the first one
    (the client mapping's timing), if any."""

    def __init__(self, total: int, done: int, where: str, timed_round: float | None = None):
        self.total, self.done, self.where = total, done, where
        self.rounds_measured, self.seconds_measured = 0, 0.0
        self.timed_round = timed_round
        self.printed_left: float | None = None

    def seconds_per_round(self) -> float | None:
        if self.rounds_measured:
            return self.seconds_measured / self.rounds_measured
        return self.timed_round

    def left(self, position: float | None = None, in_call: float = 0.0) -> float | None:
        """Seconds left with the bar at ``position`` rounds (default: the rounds done), ``in_call`` seconds
        already spent computing in the call in flight (counted against its rounds). Before any round was
        measured, the call in flight's own rate once it is `MIN_PROGRESS` of a round along; else None."""
        position = self.done if position is None else position
        progressed = position - self.done
        per_round = self.seconds_per_round()
        if per_round is None:
            if progressed < MIN_PROGRESS or in_call <= 0:
                return None
            per_round = in_call / progressed
        return max(0.0, (self.total - position) * per_round - max(0.0, in_call - progressed * per_round))

    def before_first_round(self) -> list[str]:
        """The lines printed before the first round."""
        rounds = self.total - self.done
        if self.timed_round is None:
            return [f"wall time: estimated from round {self.done + 1} once it ends ({rounds} round"
                    f"{'s' if rounds != 1 else ''} to run on {self.where})"]
        return self._estimate(f"{duration(self.timed_round)} a round, timed while choosing the client mapping")

    def call_done(self, rounds: int, seconds: float, compile_seconds: float) -> list[str]:
        """A call of ``rounds`` rounds took ``seconds``, ``compile_seconds`` of them compiling: the lines to
        print (the first estimate, or a refined one that moved enough)."""
        self.done += rounds
        self.rounds_measured += rounds
        self.seconds_measured += max(0.0, seconds - compile_seconds)
        if self.done >= self.total:
            return []
        left = self.left()
        if self.printed_left is not None:  # what the last printed estimate says is left now
            self.printed_left = max(0.0, self.printed_left - seconds)
            if abs(left - self.printed_left) <= max(REPRINT_SHIFT * self.printed_left, REPRINT_SECONDS):
                return []
        per_round = self.seconds_per_round()
        basis = (f"{duration(per_round)} a round over the {self.rounds_measured} measured"
                 + (f", {duration(compile_seconds)} compiling left out" if compile_seconds >= 1 else ""))
        return self._estimate(basis)

    def _estimate(self, basis: str) -> list[str]:
        left = self.left()
        self.printed_left = left
        rounds = self.total - self.done
        lines = [f"wall time: about {duration(left)} for the {rounds} round{'s' if rounds != 1 else ''} left on "
                 f"{self.where} ({basis})"]
        if left > HINT_AFTER:
            lines.append(f"wall time: {SHORTER}")
        return lines
