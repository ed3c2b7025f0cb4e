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
such runs, for whoever waits on many (outputs/many_runs.py). Without
matplotlib the run goes on and prints one note saying how to draw the
figures later. Tables are rebuilt from metrics.jsonl, so a resumed run's
files cover all its rounds.
"""

from __future__ import annotations

import sys
import time
from concurrent import futures
from pathlib import Path

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
        import matplotlib  # noqa: F401
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
        from fedjax_pfl.outputs import figures

        if clients is None:  # resumed run: the clients.csv of its earlier part
            clients = run_folder.read_clients(self.out)
        partition = None if self._partition_drawn else run_folder.read_partition(self.out)
        title = run_folder.title(run_folder.read_config(self.out))
        figures.draw_run(self.out / "plots", records, partition, clients, title)
        self._partition_drawn = True
