"""The round loop of the training command: compiled calls, records, checkpoints, snapshots, Ctrl-C.

One loop serves the single run and the sweep. It drives a *program* (the
compiled rounds of one run, or of several runs on an experiment axis) and one
`RunWriter` per run:

    program.call(first, count, stop) -> [(metrics, evaluations) per run]
    program.state(i)                 -> run i's (server, clients), to checkpoint
    program.evaluate(i, t)           -> run i's per-client evaluation after round t (None: not offered)

Each call runs rounds ``first .. stop-1`` (`CallPlanner` picks how many);
then each writer checks and records them, checkpoints at the checkpoint rounds
(and when Ctrl-C asked to stop) and refreshes tables and figures at
checkpoints and at the last round. ``observe(rounds_done)``, when given, is
called after every call before anything is recorded (for a notebook or a
test that signals the run at a chosen round). The loop holds no device logic
and writes no file itself.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

import jax

from fedjax_pfl.runs.call_planner import CallPlanner
from fedjax_pfl.runs.run_writer import RunWriter


class Program(Protocol):
    def call(self, first: int, count: int, stop: int) -> list[tuple[dict, dict]]: ...

    def state(self, index: int): ...

    def evaluate(self, index: int, round_index: int) -> dict | None: ...


def run_calls(program: Program, writers: Sequence[RunWriter], planner: CallPlanner, first: int, stop_request,
              bar, observe: Callable[[int], None] | None = None) -> None:
    """Run rounds ``first ..`` to the planner's total, or until Ctrl-C or until no writer is running.

    Sets each writer's status: ``finished`` after the last round,
    ``interrupted`` (with ``after_round``) when stopped by Ctrl-C; a writer
    whose run diverged is already ``failed``.
    """
    rounds = planner.total
    t = first
    while t < rounds and any(w.running for w in writers):
        stop_at = planner.stop_after(t)
        if planner.compiling:
            print(f"compiling {planner.count} round(s) per call on {jax.devices()[0].device_kind} "
                  f"({jax.default_backend()}) ...", flush=True)
        began = time.perf_counter()
        outputs = program.call(t, planner.count, stop_at)
        planner.done(stop_at - t, time.perf_counter() - began, rounds - stop_at)
        if observe is not None:
            observe(stop_at)
        last = stop_at - 1
        stopping = stop_request.requested and last < rounds - 1  # Ctrl-C: stop after this call, resumable
        for i, (writer, (metrics, evaluations)) in enumerate(zip(writers, outputs)):
            if not writer.running:
                continue
            writer.record(metrics, evaluations, t, stop_at)
            if writer.running and (stopping or planner.checkpoint_due(last)):
                writer.checkpoint(program.state(i), stop_at)
            if writer.running and (last == rounds - 1 or planner.checkpoint_due(last)):
                final = evaluations.get(last)
                writer.snapshot(final if final is not None else program.evaluate(i, last))
        running = [w for w in writers if w.running and w.records]
        if running:
            bar.set_postfix(acc=f"{sum(w.records[-1]['accuracy'] for w in running) / len(running):.4f}")
        bar.update(stop_at - t)
        t = stop_at
        if stopping:
            for writer in writers:
                writer.stopped({"status": "interrupted", "after_round": stop_at})
            return
    for writer in writers:
        writer.stopped({"status": "finished"})
