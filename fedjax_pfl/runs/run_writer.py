"""The folder of one run while it trains: what the round loop writes, in the order that loses nothing.

At the start config.json (the config, package versions, data files read,
resume history) and partition.json; after each call one fsynced
metrics.jsonl line per evaluated round (after the divergence checks of
records.py); checkpoints and result snapshots (CSV, figures) when the loop
asks; summary.json when the run stops for any reason, with its status. A
single run has one writer, a sweep one per point; a point that diverges
stops alone (``running`` turns False) while the others go on.

``files`` is where this process writes (a scratch folder on the processes of
a multi-process run other than the first); checkpoints go to ``out``, the
run folder, from every process.
"""

from __future__ import annotations

import errno
import resource
import time
from pathlib import Path

from fedjax_pfl.core.errors import DivergedError, UserError
from fedjax_pfl.engine import checkpoint
from fedjax_pfl.methods import get_method
from fedjax_pfl.methods.options import step_size_options
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.core.errors import one_line
from fedjax_pfl.outputs import metrics_file
from fedjax_pfl.runs import records as records_lib
from fedjax_pfl.outputs import run_output
from fedjax_pfl.process.disk_space import NoSpaceError, is_no_space
from fedjax_pfl.outputs.metrics_file import read_metrics
from fedjax_pfl.outputs.results_writer import ResultsWriter


def write_start(files: Path, cfg, data_files, partition_summary: dict, saved: dict | None = None,
                history: list[dict] = (), resolved: dict | None = None) -> None:
    """config.json (config, versions, data files read, resume history, what 'auto' settings resolved to) and
    partition.json."""
    try:
        files.mkdir(parents=True, exist_ok=True)
        if saved is None:
            record = {"config": config_lib.to_dict(cfg), "versions": run_output.versions(),
                      "data_files": list(data_files)}
        else:
            history = list(history)
            history[-1] = {**history[-1], "versions": run_output.versions()}
            record = {**saved, "config": config_lib.to_dict(cfg), "resumed": history}
        if resolved is not None:
            record["resolved"] = resolved
        run_output.write_json(files / "config.json", record)
        run_output.write_json(files / "partition.json", partition_summary)
    except OSError as e:
        if is_no_space(e):
            raise NoSpaceError(files, "writing config.json and partition.json", "nothing of the run was changed",
                               "run the command again") from None
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise UserError(f"cannot write the run folder {files}: {e.strerror} (this process may open "
                            f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}); raise the limit (ulimit -n) or run "
                            "fewer seeds or grid points at once") from None
        raise UserError(f"cannot write the run folder {files}: {e.strerror or e}; choose another --out") from None


class RunWriter:
    """One run folder during training (see the module docstring).

    ``rounds_done``: rounds already done (> 0 when resuming: the
    metrics.jsonl lines after the checkpoint's round are dropped, as those
    rounds run again); ``seconds_done``: wall time the run already spent;
    ``resolved``: what the config's 'auto' settings became (config.json's "resolved").
    """

    def __init__(self, out: Path, files: Path, cfg, data_files, partition_summary: dict, saved: dict | None = None,
                 history: list[dict] = (), rounds_done: int = 0, seconds_done: float = 0.0,
                 resolved: dict | None = None):
        self.out, self.files, self.cfg = Path(out), Path(files), cfg
        kept = [r for r in read_metrics(self.files / "metrics.jsonl").records if r["round"] <= rounds_done]
        write_start(self.files, cfg, data_files, partition_summary, saved, history, resolved)
        if rounds_done:  # the rounds after the checkpoint run again
            metrics_file.rewrite(self.files / "metrics.jsonl", kept)
        self.results = ResultsWriter(self.files, tensorboard=cfg.log.tensorboard)
        self.log = metrics_file.MetricsLog(self.files / "metrics.jsonl")
        self.start = time.perf_counter() - seconds_done
        self.status: dict = {"status": "running"}
        self.error: UserError | None = None  # why the run failed (DivergedError), raised by the caller
        self.snapshots = 0
        self.doing = "starting"  # what the writer writes now (named when the disk fills)
        self.out_of_space: BaseException | None = None  # the write that found the disk full, once one did
        self.step_sizes = step_size_options(get_method(cfg.method_name).hparams_type)  # named if it diverges

    @property
    def running(self) -> bool:
        return self.status["status"] == "running"

    @property
    def records(self) -> list[dict]:
        return self.log.records

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def record(self, metrics: dict, evaluations: dict, first: int, stop: int) -> None:
        """The host outputs of one call (rounds ``first .. stop-1``): checks, then one line per evaluation."""
        per_round = records_lib.rounds_of_call(metrics, stop - first)
        self.doing = f"writing metrics.jsonl after round {stop}"
        try:
            records_lib.check_rounds(per_round, self.step_sizes)
            for t in sorted(evaluations):
                self.log.write(records_lib.evaluation_record(evaluations[t], per_round[t - first], t, self.seconds(),
                                                             self.cfg.eval.model))
                self.results.evaluated(self.log.records[-1])
        except DivergedError as e:  # this run stops; the other points of a sweep go on
            self.error = e
            self.status = {"status": "failed", "error": str(e)}

    def checkpoint(self, state, rounds_done: int) -> None:
        """Save ``state`` after round ``rounds_done`` (counted from 1, the checkpoint folder's name)."""
        self.doing = f"saving the checkpoint after round {rounds_done}"
        checkpoint.save(checkpoint.checkpoint_path(self.out), state, rounds_done,
                        {"seconds": self.seconds(), "rounds_done": rounds_done})

    def snapshot(self, per_client: dict | None) -> None:
        """clients.csv (from ``per_client``, when given), metrics.csv and the figures."""
        self.doing = "writing clients.csv, metrics.csv and the figures"
        self.results.snapshot(per_client)
        self.snapshots += per_client is not None

    def stopped(self, status: dict) -> None:
        """Set the status the run stopped with, unless it already failed."""
        if self.running:
            self.status = status

    def crashed(self, error: BaseException) -> None:
        """The loop stopped on ``error``: Ctrl-C pressed twice (interrupted) or anything else (failed)."""
        if isinstance(error, KeyboardInterrupt):
            self.stopped({"status": "interrupted"})
        elif is_no_space(error):
            self.out_of_space = error
            self.stopped({"status": "failed", "error": f"no space left on the disk ({self.doing})"})
        else:
            self.stopped({"status": "failed", "error": one_line(error)})

    def no_space_error(self) -> NoSpaceError:
        """The one line a run stopped by a full disk ends with: what it was writing and what it keeps."""
        done = self.records[-1]["round"] if self.records else 0
        saved = checkpoint.latest_round(checkpoint.checkpoint_path(self.out))
        kept = (f"the run stopped; metrics.jsonl keeps its records up to round {done}" if done else "the run stopped")
        if saved is None:
            return NoSpaceError(self.out, self.doing, kept + ", and it has no checkpoint yet",
                                "start it afresh in place with --start-over")
        return NoSpaceError(self.out, self.doing, f"{kept} and its checkpoint after round {saved}")

    def abort(self) -> None:
        """summary.json at once (status interrupted), from another thread, when the process must end now."""
        summary = {"status": "interrupted", "note": "stopped at once by a second Ctrl-C; --resume continues from "
                   "the last checkpoint", **run_output.final_summary(list(self.log.records))}
        run_output.write_json(self.files / "summary.json", summary)

    def finish(self, wait_figures: bool = True) -> dict:
        """Close the files, write summary.json and (``wait_figures``) wait for the figures -> the summary. On a full
        disk what fits is written, the rest left as it was; `NoSpaceError` then, unless the run stopped for it."""
        self.doing = "writing summary.json, metrics.csv and the figures"
        full = None
        for step in (self.log.close, self._write_summary, lambda: self.results.close(wait_figures)):
            try:
                failed = step()
            except Exception as e:  # noqa: BLE001 (a full disk: the other files are still written where they fit)
                if not is_no_space(e):
                    raise
                failed = [e]
            full = full or next((e for e in failed or () if is_no_space(e)), None)
        if full is not None and self.out_of_space is None:
            self.out_of_space = full
            self.stopped({"status": "failed", "error": f"no space left on the disk ({self.doing})"})
            raise self.no_space_error()
        return self.summary()

    def summary(self) -> dict:
        return {**self.status, **run_output.final_summary(self.log.records)}

    def _write_summary(self) -> None:
        run_output.write_json(self.files / "summary.json", self.summary())
