"""Many run folders finished at once (a sweep's points): their records first, then their figures, saying so.

`finish_records` closes each run's records (metrics.jsonl, summary.json,
metrics.csv) without waiting for its figures, every one of them even when
Ctrl-C or SIGTERM comes meanwhile (each takes milliseconds; the stop is
raised once all are written). `draw_figures` then waits for the figures,
drawn one run after another by the process's drawing thread
(outputs/results_writer.py), printing a line at least every
``interval`` seconds: how many runs are drawn and about how long the rest
take. A stop while they are drawn drops the figures not begun and ends
the command with one line saying exactly which runs have what (`kept`,
once the run being drawn has its figures): every run its records, which of
them their figures, and how to draw the rest. Both take the writers duck-typed: ``finish(wait_figures=False)``,
``files`` (the run folder), ``results`` (a `ResultsWriter`).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, Sequence

from fedjax_pfl.outputs import results_writer

INTERVAL = 5.0  # seconds between progress lines (the issue: at least one every 10 s)


def finish_records(writers: Sequence, show: Callable[[str], None], interval: float = INTERVAL,
                   clock: Callable[[], float] = time.monotonic) -> list[dict]:
    """Each writer's records closed (not its figures) -> the summaries; every writer's, also when a stop signal
    (KeyboardInterrupt) comes meanwhile: it is raised once all are written, saying so (`kept`)."""
    summaries, stop, began, shown = [], None, clock(), clock()
    for i, writer in enumerate(writers):
        while True:
            try:
                summaries.append(writer.finish(wait_figures=False))
                break
            except KeyboardInterrupt as e:  # this run's records are written again, whole
                stop = e
        if clock() - shown >= interval and i + 1 < len(writers):
            shown = clock()
            show(f"records: {i + 1}/{len(writers)} runs written, about {_left(shown - began, i + 1, len(writers))}")
    if stop is not None:
        for writer in writers:
            writer.results.cancel_figures()
        stop.kept = kept([w.files for w in writers], [], figures=False)
        raise stop
    return summaries


def draw_figures(root: Path, show: Callable[[str], None], skip: bool = False, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic, poll: float = 0.1) -> None:
    """Wait for the figures of the runs closed without them (`results_writer.unwaited`), a progress line at least
    every ``interval`` seconds; on a stop signal drop those not begun and raise it, saying what each run has.
    ``skip`` (the command was asked to stop): drop them all at once, saying how to draw them later."""
    pending = results_writer.unwaited()
    if not pending or not results_writer.matplotlib_available():
        return
    if skip:
        for results in pending:
            results.cancel_figures()
        show(f"figures: not drawn (stopped); {redraw(root)} draws them")
        return
    began = shown = clock()
    show(f"figures: drawing those of {len(pending)} runs (plots/ in each run folder) ...")
    try:
        while True:
            done = sum(results.figures_done for results in pending)
            if done == len(pending):
                break
            if clock() - shown >= interval:
                shown = clock()
                show(f"figures: {done}/{len(pending)} runs drawn" +
                     (f", about {_left(shown - began, done, len(pending))}" if done else ""))
            time.sleep(poll)
    except KeyboardInterrupt as e:
        for results in pending:
            results.cancel_figures()
        for results in pending:  # the run being drawn ends its figures: then the line says what the folders hold
            results.wait_figures()
        e.kept = kept([r.out for r in pending], [r.out for r in pending if r.figures_drawn], figures=True, root=root)
        raise
    for results in pending:
        results.wait_figures()  # (their warnings, if any)
    show(f"figures: all {len(pending)} runs drawn in {clock() - began:.0f} s")


def _left(seconds: float, done: int, total: int) -> str:
    left = seconds / max(done, 1) * (total - done)
    return f"{left:.0f} s left" if left < 120 else f"{left / 60:.0f} min left"


def kept(folders: Sequence[Path], drawn: Sequence[Path], figures: bool, root: Path | None = None) -> str:
    """What a stopped sweep keeps, in one line: every run's records, and which runs have their figures."""
    text = f"every one of the {len(folders)} runs has its records (metrics.jsonl, summary.json, metrics.csv)"
    if not figures:
        return text + f"; no figures were drawn ({redraw(root or common(folders))} draws them)"
    if not drawn:
        text += "; none has its figures"
    elif len(drawn) == len(folders):
        return text + " and its figures"
    else:
        text += f"; {len(drawn)} have their figures too ({named(drawn, root)})"
    return text + f"; {redraw(root or common(folders))} draws the rest"


def redraw(root: Path) -> str:
    """The command that draws the figures of the runs under ``root``."""
    return f"python -m fedjax_pfl.report {root} --redraw --out {root}/report"


def common(folders: Sequence[Path]) -> Path:
    return Path(os.path.commonpath([str(f) for f in folders])) if folders else Path(".")


def named(folders: Sequence[Path], root: Path | None = None) -> str:
    """Run folders by name, runs of consecutive seeds as one range: 'seed0-seed36, lr0.1/seed2'."""
    names = [str(Path(f).relative_to(root)) if root is not None else Path(f).name for f in folders]
    parts: list[list] = []  # [prefix, first seed, last seed] or [name]
    for name in names:
        match = re.fullmatch(r"(.*?seed)(\d+)", name)
        if match and parts and len(parts[-1]) == 3 and parts[-1][0] == match[1] and parts[-1][2] + 1 == int(match[2]):
            parts[-1][2] += 1
        elif match:
            parts.append([match[1], int(match[2]), int(match[2])])
        else:
            parts.append([name])
    return ", ".join(p[0] if len(p) == 1 else f"{p[0]}{p[1]}" + (f"-{p[0]}{p[2]}" if p[2] > p[1] else "")
                     for p in parts)
