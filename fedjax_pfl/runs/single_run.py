"""One configuration trained end to end: experiment, (resumed) state, the round loop, the run folder.

`run_single` builds the experiment (runs/experiment.py), starts from the
method's init or, with ``resume``, from the run's checkpoint, and drives the
round loop (runs/loop.py) over one `RunWriter`. Only process 0 of a
multi-process run writes the run folder; every process writes its shards of
the checkpoints.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from fedjax_pfl.engine import checkpoint, distributed, host_clients, mapping_choice, sharding
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.runs import host_devices
from fedjax_pfl.runs import resume as resume_lib
from fedjax_pfl.outputs import run_output
from fedjax_pfl.runs.call_planner import CallPlanner
from fedjax_pfl.runs.experiment import ValidRun, build_experiment, require_valid, resolved_notes, resolved_settings
from fedjax_pfl.runs.loop import run_calls
from fedjax_pfl.outputs.folder_claim import claimed
from fedjax_pfl.runs.progress import RunProgress
from fedjax_pfl.runs.run_writer import RunWriter
from fedjax_pfl.process.stop_request import StopRequest


class SingleProgram:
    """The compiled rounds of one run (`Engine.run_rounds`, or `HostClients.run_rounds` with client state on the
    host), holding its state between calls."""

    def __init__(self, engine, server, clients, key, cfg: config_lib.RunConfig, choice: dict | None = None):
        self.engine, self.server, self.clients, self.key = engine, server, clients, key
        self.rounds, self.eval_every, self.choice = cfg.train.rounds, cfg.eval_every, choice  # (`timed`)

    def timed(self, rounds: int, seconds: float, t: int) -> None:
        """A call ran rounds .. t-1 without compiling: an ``auto`` mapping slower than its estimate is timed again."""
        self.engine, self.choice = mapping_choice.retime(self.engine, self.choice, seconds / rounds, self.server,
                                                         self.clients, engine_lib.round_keys(self.key, t)[0], t,
                                                         self.rounds - t, print)

    def call(self, first: int, count: int, stop: int):
        self.server, self.clients, metrics, evaluations = self.engine.run_rounds(
            self.server, self.clients, self.key, first, count, self.rounds, self.eval_every, stop=stop)
        return [(metrics, evaluations)]

    def state(self, index: int):
        return self.server, self.clients

    def evaluate(self, index: int, round_index: int):
        eval_key = engine_lib.round_keys(self.key, round_index)[1]
        return self.engine.evaluate(self.server, self.clients, eval_key, round_index=round_index)


def run_single(run: ValidRun, progress: bool = True, resume: bool = False, observe=None,
               stop: StopRequest | None = None, start_over: bool = False) -> dict:
    """Train ``run`` into its run folder, held for the run (outputs/folder_claim.py); returns the final summary.

    ``stop``: the Ctrl-C and SIGTERM handling to use (the caller reads ``stop.requested`` afterwards);
    ``start_over``: replace the run the folder holds."""
    require_valid(run, "run_single")
    out = run.out
    stop = stop or StopRequest()
    if not distributed.is_main_process():  # only process 0 writes the run folder (checkpoints: every process)
        with tempfile.TemporaryDirectory(prefix="fedjax_pfl-process-") as scratch:
            return _train(run, out, Path(scratch), False, resume, observe, stop)
    with claimed(out, checkpoint.has_checkpoint, resume, start_over):
        return _train(run, out, out, progress, resume, observe, stop)


def _train(run: ValidRun, out: Path, files: Path, progress: bool, resume: bool, observe, stop: StopRequest) -> dict:
    """`run_single` with the run folder ``out`` (checkpoint, resume) and ``files``, where this process writes."""
    cfg = run.config
    saved = resume_lib.saved_run(out) if resume else None
    if saved is not None:  # before any data is read
        resume_lib.check_same_config(saved, cfg)
        saved_round = checkpoint.latest_round(checkpoint.checkpoint_path(out))
        for warning in resume_lib.check_metrics(out, saved, saved_round) if saved_round is not None else ():
            print(warning, file=sys.stderr)
    began = time.perf_counter()
    for key, why in resolved_notes(cfg).items():  # what 'auto' became: data.name, model.name
        print(f"{key}: {why}", flush=True)
    print(f"loading {cfg.data.name} and partitioning it ({cfg.partition.scheme}) ...", flush=True)
    exp = build_experiment(run, progress=progress)
    cfg = exp.config  # (with what its data decided: a model 'auto')
    print(exp.partition_text + ("\n" + exp.data.memory.estimate.line() if exp.data.memory else ""), flush=True)
    print(f"loaded and partitioned in {time.perf_counter() - began:.1f} s; initialising the model and "
          f"{'restoring' if resume else 'creating'} the clients' state ...", flush=True)
    init_key, key = jax.random.split(jax.random.key(cfg.seed))
    on_host, where = host_clients.keep_on_host(cfg.train.client_state, exp.engine)
    print(where, flush=True)
    store = host_clients.HostClients(exp.engine) if on_host else None
    server, clients = (store.init(init_key), store.clients) if on_host else exp.engine.init(init_key)
    done, seconds_done, history = 0, 0.0, []
    if resume:
        (server, clients), _, meta = checkpoint.restore(checkpoint.checkpoint_path(out), (server, clients),
                                                        num_clients=exp.engine.num_clients)
        if on_host:
            clients = store.clients = jax.tree.map(np.array, clients)  # writable host arrays again
        done = int(meta["rounds_done"])
        history = resume_lib.check_resume(saved, cfg, done, exp.partition_summary,
                                          run_output.read_json(out / "partition.json"))
        seconds_done = float(meta["seconds"])
    if on_host:  # timing candidates would put [N, ...] on the device
        choice = mapping_choice.with_padding(exp.engine, mapping_choice.untimed(
            exp.engine, cfg.train.client_mapping, "untimed: client state on the host"),
            engine_lib.round_keys(key, done)[0], done)
    else:
        exp.engine, choice = mapping_choice.choose_or_default(
            exp.engine, cfg.train.client_mapping, cfg.train.rounds - done, server, clients,
            engine_lib.round_keys(key, done)[0], done, report=lambda line: print(line, flush=True))
    resolved = resolved_settings(cfg, choice)
    print(f"{host_devices.describe(resolved['devices.cpu'])}; {mapping_choice.describe(choice)}", flush=True)
    writer = RunWriter(out, files, cfg, exp.data_files, exp.partition_summary, saved, history, done, seconds_done,
                       resolved=resolved)
    program = SingleProgram(store or exp.engine, server, clients, key, cfg, choice)
    planner = CallPlanner(cfg.train.rounds_per_call, cfg.train.rounds, cfg.checkpoint_every)
    display = RunProgress(cfg.train.rounds, done, exp.engine.training_rows(), progress,
                          devices=sharding.mesh_size(exp.engine.mesh), timed_round=mapping_choice.round_seconds(choice))
    stop.aborts = [writer.abort]
    try:
        with stop:
            run_calls(program, [writer], planner, done, stop, display, observe)
    except BaseException as e:
        writer.crashed(e)
        if writer.out_of_space is not None:  # one line: what it was writing, what is kept, how to go on
            raise writer.no_space_error() from None
        raise
    finally:
        display.close()
        summary = writer.finish()
    if writer.error is not None:
        raise writer.error
    report_end(out, writer, summary, cfg.eval.model, (stop.reason or stop.name) if stop.requested else None)
    return summary


def written(folder: Path) -> list[str]:
    """The outputs of a run that ``folder`` holds now (only those, e.g. no clients.csv before a snapshot)."""
    names = ["config.json", "partition.json", "metrics.jsonl", "metrics.csv", "clients.csv", "summary.json"]
    found = [name for name in names if (folder / name).is_file()]
    found += [f"plots/{p.name}" for p in sorted((folder / "plots").glob("*.png"))]
    return found + (["TensorBoard events"] if any(folder.glob("events.out.tfevents.*")) else [])


def report_end(out: Path, writer: RunWriter, summary: dict, eval_model: str, stopped_by: str | None = None) -> None:
    """The lines a finished or interrupted run prints: what it wrote, how to continue, its accuracy."""
    print(f"wrote {out}/ ({', '.join(written(writer.files))})")
    if summary["status"] == "interrupted":
        print(f"interrupted after round {summary['after_round']}: checkpoint and summary written to {out}; "
              "continue with the same command and --resume", file=sys.stderr)
    elif stopped_by:
        print(f"stopped by {stopped_by} during the last round, after finishing it: the run in {out} is complete",
              file=sys.stderr)
    if "last" in summary:
        mean, best = summary["mean_last_10"], summary["best_optimistic"]
        print(f"final accuracy {summary['last']['accuracy']:.4f} (mean of last {mean['evaluations']} evals "
              f"{mean['accuracy']:.4f}; best {best['by_accuracy']['accuracy']:.4f} at round "
              f"{best['by_accuracy']['round']}, best weighted {best['by_accuracy_weighted']['accuracy_weighted']:.4f} "
              f"at round {best['by_accuracy_weighted']['round']}; eval.model={eval_model})")
