"""The round loop of the training command: compiled calls, records, checkpoints, snapshots, Ctrl-C.

One loop serves the single run and the sweep. It drives a *program* (the
compiled rounds of one run, or of several runs as federations) and one
`RunWriter` per run:

    program.call(first, count, stop) -> [(metrics, evaluations) per run]
    program.state(i)                 -> run i's (server, clients), to checkpoint
    program.evaluate(i, t)           -> run i's per-client evaluation after round t (None: not offered)

Each call runs rounds ``first .. stop-1`` (by the engine's index from 0;
`CallPlanner` picks how many); then each writer checks and records them,
checkpoints at the checkpoint rounds (and when Ctrl-C asked to stop) and
refreshes tables and figures at checkpoints and at the last round. The
display (progress.py) hears of each call and of the engine's in-round events;
the stop request (stop_request.py) of the call in flight. ``observe
(rounds_done)``, when given, is called after every call before anything is
recorded (for a notebook or a test that signals the run at a chosen round).
The loop holds no device logic and writes no file itself.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

from fedjax_pfl.runs.call_planner import CallPlanner
from fedjax_pfl.runs.progress import RunProgress
from fedjax_pfl.runs.run_writer import RunWriter
from fedjax_pfl.process.stop_request import StopRequest


class Program(Protocol):
    def call(self, first: int, count: int, stop: int) -> list[tuple[dict, dict]]: ...

    def state(self, index: int): ...

    def evaluate(self, index: int, round_index: int) -> dict | None: ...


def run_calls(program: Program, writers: Sequence[RunWriter], planner: CallPlanner, first: int,
              stop_request: StopRequest, display: RunProgress, observe: Callable[[int], None] | None = None) -> None:
    """Run rounds ``first ..`` to the planner's total, or until Ctrl-C or until no writer is running.

    Sets each writer's status: ``finished`` after the last round (also when
    Ctrl-C came during it), ``interrupted`` (with ``after_round``) when
    stopped by Ctrl-C before; a writer whose run diverged is already ``failed``.
    """
    with program.engine.progress.listening(display.event):
        _run_calls(program, writers, planner, first, stop_request, display, observe)


def _run_calls(program, writers, planner, first, stop_request, display, observe) -> None:
    rounds = planner.total
    t = first
    while t < rounds and any(w.running for w in writers):
        stop_at = planner.stop_after(t)
        stop_request.in_flight = (stop_at, rounds)
        display.call_starts(t, stop_at, planner.compiling, planner.count)
        compiled, began = planner.compiling, time.perf_counter()
        outputs = program.call(t, planner.count, stop_at)
        planner.done(stop_at - t, seconds := time.perf_counter() - began, rounds - stop_at)
        if not compiled and hasattr(program, "timed"):  # rounds timed without compiling (mapping_choice.retime)
            program.timed(stop_at - t, seconds, stop_at)
        if observe is not None:
            observe(stop_at)
        last = stop_at - 1
        for i, (writer, (metrics, evaluations)) in enumerate(zip(writers, outputs)):
            if not writer.running:
                continue
            writer.record(metrics, evaluations, t, stop_at)
            if writer.running and planner.checkpoint_due(last):
                writer.checkpoint(program.state(i), stop_at)
            if writer.running and (last == rounds - 1 or planner.checkpoint_due(last)):
                final = evaluations.get(last)
                writer.snapshot(final if final is not None else program.evaluate(i, last))
        running = [w for w in writers if w.running and w.records]
        display.call_done(stop_at, sum(w.records[-1]["accuracy"] for w in running) / len(running) if running else None)
        t = stop_at
        if stop_request.requested and t < rounds:  # Ctrl-C: stop here, resumable from a checkpoint of round t
            for i, writer in enumerate(writers):
                if writer.running and not planner.checkpoint_due(last):
                    writer.checkpoint(program.state(i), t)
                writer.stopped({"status": "interrupted", "after_round": t})
            return
    for writer in writers:
        writer.stopped({"status": "finished"})
