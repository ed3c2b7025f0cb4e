"""How many rounds each compiled call of a run runs (``train.rounds_per_call``)."""

from __future__ import annotations


class CallPlanner:
    """How many rounds each compiled call runs (``train.rounds_per_call``).

    A fixed K > 0 is used as given. Auto (0) runs single-round calls until one
    has been timed without compilation, then fuses as many rounds as take about
    ``target_seconds`` (at most 50), so small models are not dominated by
    dispatch and the progress bar still moves. A call always ends at a
    checkpoint round; every call of one K reuses one compiled program.
    """

    def __init__(self, rounds_per_call: int, total_rounds: int, checkpoint_every: int,
                 target_seconds: float = 2.0, max_count: int = 50):
        self.fixed = rounds_per_call > 0
        self.count = rounds_per_call if self.fixed else 1
        self.total, self.checkpoint_every = total_rounds, checkpoint_every
        self.target, self.max_count = target_seconds, max_count
        self.compiling = True
        self._calls_of_count = 0

    def checkpoint_due(self, t: int) -> bool:
        ce = self.checkpoint_every
        return bool(ce) and ((t + 1) % ce == 0 or t == self.total - 1)

    def stop_after(self, t: int) -> int:
        """Exclusive end of the call starting at round ``t``."""
        stop = min(t + self.count, self.total)
        if self.checkpoint_every:
            stop = min(stop, (t // self.checkpoint_every + 1) * self.checkpoint_every)
        return stop

    def done(self, rounds_run: int, seconds: float, rounds_left: int) -> None:
        """Record a call of ``rounds_run`` rounds that took ``seconds``; ``rounds_left`` remain."""
        self._calls_of_count += 1
        self.compiling = False
        if self.fixed or self.count > 1 or self._calls_of_count < 2:
            return
        per_round = seconds / max(rounds_run, 1)
        # never compile a program with more round slots than the run has left
        count = int(min(self.max_count, rounds_left, max(1, self.target // max(per_round, 1e-6))))
        if count > 1:
            self.count, self.compiling, self._calls_of_count = count, True, 0
