"""What a run writes beside metrics.jsonl while it goes: CSVs, figures, TensorBoard.

The training loop calls three hooks:
- `evaluated(record)` after each evaluation: TensorBoard scalars, and at most
  every ``refresh_seconds`` a refresh of metrics.csv and the curves, so a long
  run without checkpoints still shows its progress;
- `snapshot(per_client)` at each checkpoint and at the end: metrics.csv,
  clients.csv (from ``Engine.evaluate``'s per-client arrays) and all figures;
- `close()` when the run stops for any reason: brings metrics.csv and the
  curves up to date (a failed or interrupted run keeps what it had) and waits
  for the figures.
CSV files are small and written in the calling thread. Figures are drawn in
one background thread, shared by every run of the process (a sweep's runs
draw one after another, one run's figures in memory at a time), that only
ever draws a run's newest snapshot, so rounds never wait on matplotlib.
``close(wait=False)`` leaves a run's figures to that thread: `unwaited` lists
such runs, for whoever waits on many (below). Without
matplotlib the run goes on and prints one note saying how to draw the
figures later. Tables are rebuilt from metrics.jsonl, so a resumed run's
files cover all its rounds.

Many runs finished at once (a sweep's points): `finish_records` closes each
run's records (metrics.jsonl, summary.json, metrics.csv) without waiting for
its figures, every one even when Ctrl-C or SIGTERM comes meanwhile (each
takes milliseconds; the stop is raised once all are written);
`draw_figures` then waits for the figures, drawn one run after another,
printing a line at least every `INTERVAL` seconds: how many runs are drawn
and about how long the rest take. A stop while they are drawn drops the
figures not begun and ends the command with one line saying exactly which
runs have what (`kept`, once the run being drawn has its figures): every run
its records, which of them their figures, and how to draw the rest. Both
take the writers duck-typed: ``finish(wait_figures=False)``, ``files`` (the
run folder), ``results`` (a `ResultsWriter`).
"""

from __future__ import annotations

import os
import re
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Callable, Sequence

from fedjax_pfl.outputs import run_folder, tables
from fedjax_pfl.process.disk_space import is_no_space
from fedjax_pfl.outputs.tensorboard_log import TensorBoardLog

NO_MATPLOTLIB = ("note: figures skipped, matplotlib is not installed (pip install 'fedjax_pfl[plots]'; "
                 "then python -m fedjax_pfl.report --redraw {out} draws them)")


_drawer: futures.ThreadPoolExecutor | None = None  # the process's one drawing thread (`drawer`)
_unwaited: list["ResultsWriter"] = []  # runs closed without waiting for their figures


def drawer() -> futures.ThreadPoolExecutor:
    """The one thread that draws every run's figures in this process."""
    global _drawer
    if _drawer is None:
        _drawer = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedjax_pfl-figures")
    return _drawer


def unwaited() -> list["ResultsWriter"]:
    """The runs closed with ``wait=False`` whose figures nobody has waited for yet (taken off the list)."""
    taken = list(_unwaited)
    _unwaited.clear()
    return taken


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401  (the optional [plots] extra: is it here?)
    except ImportError:
        return False
    return True


class ResultsWriter:
    """Tables, figures and TensorBoard scalars of the run in ``out`` (see the module docstring)."""

    def __init__(self, out: Path, tensorboard: bool = False, refresh_seconds: float = 120.0):
        self.out = Path(out)
        self.tensorboard = TensorBoardLog(self.out) if tensorboard else None  # UserError if not installed
        self.refresh_seconds = refresh_seconds
        self.draws = matplotlib_available()
        if not self.draws:
            print(NO_MATPLOTLIB.format(out=self.out), file=sys.stderr)
        self._jobs: list[futures.Future] = []
        self._generation = 0
        self._refreshed_at = time.monotonic()
        self._written_records = -1
        self._clients: list[dict] | None = None
        self._partition_drawn = False  # the partition never changes during a run: draw it once (~1 s)

    def evaluated(self, record: dict) -> None:
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        if time.monotonic() - self._refreshed_at >= self.refresh_seconds:
            self._refresh()

    def snapshot(self, per_client: dict | None = None) -> None:
        if per_client is not None:
            partition = run_folder.read_partition(self.out)
            self._clients = tables.client_rows(per_client, partition)
            tables.write_clients_csv(self.out / "clients.csv", self._clients)
        self._refresh(force=True)

    def close(self, wait: bool = True) -> list[BaseException]:
        """Bring metrics.csv and the figures up to date and (``wait``) wait for the figures -> the errors of figures
        not drawn (each printed as a warning, but a full disk's: the caller reports that once). Without
        ``wait`` the figures are drawn later (`unwaited`, `wait_figures`)."""
        try:
            self._refresh()
            if not wait:
                if self not in _unwaited:
                    _unwaited.append(self)
                return []
            return self.wait_figures()
        finally:
            if self.tensorboard is not None:
                self.tensorboard.close()

    @property
    def figures_done(self) -> bool:
        """Whether every figure queued for this run is drawn (or failed, or was cancelled)."""
        return all(job.done() for job in self._jobs)

    @property
    def figures_drawn(self) -> bool:
        """Whether every figure queued for this run was drawn (none cancelled)."""
        return self.figures_done and not any(job.cancelled() for job in self._jobs)

    def wait_figures(self) -> list[BaseException]:
        """Wait for this run's figures -> the errors of those not drawn (printed, but a full disk's)."""
        futures.wait(self._jobs)
        failed = [job.exception() for job in self._jobs if not job.cancelled() and job.exception() is not None]
        for error in failed:
            if not is_no_space(error):
                print(f"warning: figures in {self.out / 'plots'} not drawn: {error!r}", file=sys.stderr)
        return failed

    def cancel_figures(self) -> None:
        """Drop this run's figures not yet begun (the one being drawn ends)."""
        for job in self._jobs:
            job.cancel()

    def _refresh(self, force: bool = False) -> None:
        """Rewrite metrics.csv and queue the figures, unless nothing changed since the last time."""
        records = run_folder.read_records(self.out)
        if len(records) == self._written_records and not force:
            return
        self._written_records = len(records)
        self._refreshed_at = time.monotonic()
        tables.write_metrics_csv(self.out / "metrics.csv", records)
        if self.draws:
            self._generation += 1
            self._jobs.append(drawer().submit(self._draw, self._generation, records, self._clients))

    def _draw(self, generation: int, records: list[dict], clients: list[dict] | None) -> None:
        if generation != self._generation:  # a newer snapshot is queued; draw that one instead
            return
        from fedjax_pfl.outputs import figures  # (imports matplotlib, an optional extra)

        if clients is None:  # resumed run: the clients.csv of its earlier part
            clients = run_folder.read_clients(self.out)
        partition = None if self._partition_drawn else run_folder.read_partition(self.out)
        title = run_folder.title(run_folder.read_config(self.out))
        figures.draw_run(self.out / "plots", records, partition, clients, title)
        self._partition_drawn = True


# ---------------------------------------------------------------- many runs at once (a sweep's points)

INTERVAL = 5.0  # seconds between progress lines


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
    pending = unwaited()
    if not pending or not matplotlib_available():
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


def stopped_between(folders: Sequence[Path], done: int, root: Path) -> str:
    """The line of a sweep stopped after its first ``done`` runs (one program's worth or more) of ``folders``."""
    return (f"stopped: {named(folders[:done], root)} have their records; {named(folders[done:], root)} did not "
            "start (their folders are not made)")


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
