"""Many runs as ONE compiled program: a sweep's seeds and grid points, a table's cells, as federations.

``python -m fedjax_pfl.train ... --seeds 0,1,2 train.lr=[0.1,0.05] method.mu=[0,0.01]``
expands into points (every combination of the listed values, times the seeds).
Each point is a federation, a set of rows of one program (`FederationProgram`,
engine/rows.py `FederationRows`): its initial state from its own seed, its
client sampling and batch order from its own round keys, its grid values
entering the compiled round as its hyperparameters, a pytree argument with a
leading federation axis (methods/base.py `Hyperparams`). The points share the
data partition (drawn with ``data_seed``, else ``seed``; with
``vary_data_with_seed`` each seed draws its own, stored once beside the
others). Values that a method uses as Python numbers cannot be listed
(one-line error).

Each point writes its own run folder under ``--out`` (``seed3/``,
``lr0.05_mu0.01/seed3/``), exactly what the single run ``--seed 3 data_seed=D
train.lr=0.05 method.mu=0.01`` writes (its config.json says so; the numbers
agree within float tolerance: tests/test_sweep.py), so any point can be
continued on its own with ``--resume``. ``sweep.json`` and ``sweep.md`` beside
them give, per grid point, mean +- std over seeds of the final and mean-of-
last-10 test accuracy, and name the best point by validation accuracy
(``partition.val_fraction > 0``, carved from the train split) with its test
accuracy beside it; without validation data no point is named, so nothing is
picked on test data.

Runs that differ in their partition or their participation too (a paper
table's cells for one method: another Dirichlet alpha, another join ratio,
another seed) are federations of one program the same way (`run_federations`):
each writes its own run folder, its numbers those of its single run within
float tolerance (integer state exactly).

Memory guard: a point's stacked state (server + all clients) is sized from
the method's init shapes; a call holds about ``STATE_COPIES`` times that per
point (the state, its donated successor, the selected clients' copies and
their uploads). The points are split into programs of at most
``train.max_experiments_per_call`` (0: as many as fit in half the free
memory of the device: ``memory_stats()`` on GPU/TPU, free host RAM on CPU),
run one after another.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.runs import config as config_lib
from fedjax_pfl.engine import checkpoint, mapping_choice, sharding
from fedjax_pfl.engine import engine as engine_lib
from fedjax_pfl.engine.rows import Federation, FederationRows
from fedjax_pfl.outputs import results_writer, run_output
from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.runs.call_planner import CallPlanner
from fedjax_pfl.runs import host_devices
from fedjax_pfl.runs.experiment import (ValidRun, build_experiment, require_valid, resolve_model, resolved_notes,
                                        resolved_settings)
from fedjax_pfl.runs.loop import run_calls
from fedjax_pfl.outputs.folder_lock import locked
from fedjax_pfl.outputs.folder_claim import claimed
from fedjax_pfl.runs.progress import RunProgress
from fedjax_pfl.runs.run_writer import RunWriter
from fedjax_pfl.process.stop_request import StopRequest

STATE_COPIES = 4


def experiments_per_call(engine, cfg: config_lib.RunConfig, count: int) -> int:
    """How many points one program runs at once (see the module docstring)."""
    if cfg.train.max_experiments_per_call:
        return min(count, cfg.train.max_experiments_per_call)
    shapes = jax.eval_shape(lambda k: engine.method.init(k, engine.num_clients), jax.random.key(0))
    per_point = STATE_COPIES * sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(shapes))
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    else:
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return int(max(1, min(count, (free // 2) // max(per_point, 1))))


def experiment_of(run: ValidRun, built: dict, progress: bool = False):
    """The experiment of ``run``'s partition (its settings and drawn data seed), built once: ``built`` keeps
    them by partition, and a dataset once read serves the next partitions (generated data: drawn anew)."""
    cfg = run.checked
    key = repr((config_lib.to_dict(cfg)["partition"], config_lib.drawn_data_seed(cfg.seed, cfg.data_seed)))
    if key not in built:
        first = next(iter(built.values()), None)
        reuse = first is not None and cfg.data.name != "synthetic"  # generated data depend on the seed
        built[key] = build_experiment(run, dataset=first.dataset if reuse else None, progress=progress)
    return built[key]


def run_program(program, exps: list, runs: list[ValidRun], progress: bool, stop: StopRequest,
                observe) -> list[dict]:
    """Run ``program`` (several runs: ``runs``, built as ``exps``) to the end (or to Ctrl-C), each writing its own
    run folder -> their summaries."""
    print(mapping_choice.describe(program.mapping), flush=True)
    cfgs = [run.config for run in runs]
    for cfg, exp in zip(cfgs, exps):
        resolve_model(cfg, exp.dataset.is_image)  # what its data decided (a model 'auto'), as config.json records
    writers = [RunWriter(Path(cfg.out), Path(cfg.out), cfg, exp.data_files, exp.partition_summary,
                         resolved=resolved_settings(cfg, program.mapping)) for exp, cfg in zip(exps, cfgs)]
    cfg = cfgs[0]
    planner = CallPlanner(cfg.train.rounds_per_call, cfg.train.rounds, cfg.checkpoint_every)
    display = RunProgress(cfg.train.rounds, 0, program.training_rows(), progress,
                          devices=sharding.mesh_size(program.engine.mesh),
                          timed_round=mapping_choice.round_seconds(program.mapping))
    stop.aborts = [writer.abort for writer in writers]
    try:
        with stop:
            run_calls(program, writers, planner, 0, stop, display, observe)
    except BaseException as e:
        for writer in writers:
            writer.crashed(e)
        raise
    finally:
        display.close()
        summaries = results_writer.finish_records(writers, lambda line: print(line, flush=True))
    return summaries


POOLED = ("seed", "data_seed", "vary_data_with_seed", "partition", "train.join_ratio", "out")  # rows may differ in


def pooled_difference(cfgs: list[config_lib.RunConfig]) -> str | None:
    """The first setting (dotted key) in which ``cfgs`` differ beyond `POOLED`, or None: they can be rows."""
    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            name = f"{prefix}{key}"
            if not any(name == p or name.startswith(p + ".") for p in POOLED):
                out.update(flat(value, name + ".") if isinstance(value, dict) and key != "method" else {name: value})
        return out

    first = flat(config_lib.to_dict(cfgs[0]))
    for cfg in cfgs[1:]:
        other = flat(config_lib.to_dict(cfg))
        for key in sorted(set(first) | set(other)):
            if first.get(key) != other.get(key):
                return key
    return None


class FederationProgram:
    """The compiled rounds of ``runs`` as federations, rows of one program (`FederationRows`): runs that differ
    only in seed, partition, participation or grid values (``run.values``); ``built``: their experiments by
    partition (`experiment_of`), shared with other programs.

    ``mapping``: the client mapping's record (engine/mapping_choice.py). With ``train.client_mapping=auto``
    the candidates are timed on this program's own first round, all runs at once, and the fastest runs it
    (untimed where the run is short, as a single run); ``earlier``: the timed record of an earlier program of
    as many runs, whose choice this one reuses (the same program shape) instead of timing again."""

    def __init__(self, runs: list[ValidRun], progress: bool = False, built: dict | None = None,
                 earlier: dict | None = None, report=None):
        built = {} if built is None else built
        self.exps = [experiment_of(run, built, progress) for run in runs]
        cfgs = [run.checked for run in runs]
        federations = [Federation(*e.engine.client_data, engine_lib.clients_per_round(e.engine.num_clients,
                                                                                     cfg.train.join_ratio))
                       for e, cfg in zip(self.exps, cfgs)]  # (an experiment shared by runs: its own join ratio)
        engine = FederationRows(self.exps[0].engine.method, federations, self.exps[0].engine.config)
        keys = jnp.stack([jnp.stack(jax.random.split(jax.random.key(cfg.seed))) for cfg in cfgs])
        self.keys = keys[:, 1]
        self.servers, self.clients = engine.init(keys[:, 0])
        self.values = {name: jnp.asarray([run.values[name] for run in runs], jnp.float32) for name in runs[0].values}
        self.rounds, self.eval_every = cfgs[0].train.rounds, cfgs[0].eval_every
        if earlier is not None and earlier["timed"]:
            why = f"timed on an earlier program of {len(runs)} runs"
            self.engine, mapping = mapping_choice.reuse(engine, earlier, why)
        else:
            round_keys = jax.vmap(engine_lib.round_keys, in_axes=(0, None))(self.keys, 0)[0]
            self.engine, mapping = mapping_choice.choose_or_default(
                engine, cfgs[0].train.client_mapping, self.rounds, self.servers, self.clients, round_keys, 0,
                report=report, values=self.values)
        self.mapping = {**mapping, "program": [f"{Path(cfg.out).parent.name}/{Path(cfg.out).name}" for cfg in cfgs]}

    def training_rows(self) -> int:
        return self.engine.training_rows()

    def call(self, first: int, count: int, stop: int):
        self.servers, self.clients, metrics, evaluations = self.engine.run_rounds(
            self.servers, self.clients, self.keys, first, count, self.rounds, self.eval_every, stop=stop,
            values=self.values)
        return list(zip(metrics, evaluations))

    def state(self, index: int):
        return self.engine.state(self.servers, self.clients, index)

    def evaluate(self, index: int, round_index: int):
        return None  # (the snapshot keeps the latest evaluation's clients.csv)


def run_federations(runs: list[ValidRun], progress: bool = True, observe=None,
                    stop: StopRequest | None = None, start_over: bool = False) -> list[dict]:
    """Train ``runs`` (each with its own ``out``) as rows of ONE program (module docstring); each writes
    its run folder as its single run would. A one-line UserError when they differ in more than `POOLED` or
    their method cannot run as rows; their folders are held for the whole program."""
    stop = stop or StopRequest()
    for run in runs:
        require_valid(run, "run_federations")
    cfgs = [run.checked for run in runs]
    other = pooled_difference(cfgs)
    if other is not None:
        raise UserError(f"runs as rows of one program may differ only in seed, partition and join ratio, not in "
                        f"{other}; run them one by one")
    with contextlib.ExitStack() as held:
        for cfg in cfgs:
            held.enter_context(claimed(Path(cfg.out), checkpoint.has_checkpoint, start_over=start_over))
        program = FederationProgram(runs, progress, report=lambda line: print(line, flush=True))
        print(f"{len(cfgs)} runs as rows of one program on {jax.devices()[0].device_kind} ({jax.default_backend()})",
              flush=True)
        summaries = run_program(program, program.exps, runs, progress, stop, observe)
        results_writer.draw_figures(Path(cfgs[0].out).parent, lambda line: print(line, flush=True), stop.requested)
        return summaries


def _mean_std(values) -> dict:
    v = np.asarray(values, np.float64)
    return {"mean": float(v.mean()), "std": float(v.std()), "n": int(v.size)}


def sweep_summary(points: list[ValidRun], summaries: list[dict]) -> dict:
    """Per grid point, mean +- std over seeds; the best point by validation accuracy (if any)."""
    groups: dict[str, list[dict]] = {}
    values: dict[str, dict] = {}
    for point, summary in zip(points, summaries):
        groups.setdefault(point.grid_name, []).append(summary)
        values[point.grid_name] = dict(point.values)
    table = []
    for name, group in groups.items():
        done = [s for s in group if "last" in s]
        row = {"point": name or "-", "values": values[name], "seeds": len(group), "finished": len(done)}
        if done:
            row["test_last"] = _mean_std([s["last"]["accuracy"] for s in done])
            row["test_mean_last_10"] = _mean_std([s["mean_last_10"]["accuracy"] for s in done])
            if all("validation" in s for s in done):
                row["val_mean_last_10"] = _mean_std([s["validation"]["mean_last_10"] for s in done])
        table.append(row)
    with_val = [r for r in table if "val_mean_last_10" in r]
    best = max(with_val, key=lambda r: r["val_mean_last_10"]["mean"]) if with_val else None
    return {
        "points": table,
        "best_by_validation": None if best is None else {
            "point": best["point"], "values": best["values"], "val_mean_last_10": best["val_mean_last_10"],
            "test_mean_last_10": best["test_mean_last_10"]},
        "note": ("best point chosen on validation accuracy (mean of the last 10 evaluations), test beside it"
                 if best else "no validation data (partition.val_fraction = 0): no point is picked"),
    }


def sweep_markdown(summary: dict) -> str:
    fmt = lambda m: f"{m['mean']:.4f} +- {m['std']:.4f}" if m else "-"  # noqa: E731
    lines = ["| point | seeds | test acc (last) | test acc (mean last 10) | val acc (mean last 10) |",
             "|---|---|---|---|---|"]
    for r in summary["points"]:
        lines.append(f"| {r['point']} | {r['finished']}/{r['seeds']} | {fmt(r.get('test_last'))} | "
                     f"{fmt(r.get('test_mean_last_10'))} | {fmt(r.get('val_mean_last_10'))} |")
    best = summary["best_by_validation"]
    lines += ["", f"Best by validation: {best['point']}" if best else summary["note"]]
    return "\n".join(lines) + "\n"


def run_sweep(run: ValidRun, progress: bool = True, resume: bool = False, observe=None,
              stop: StopRequest | None = None, start_over: bool = False) -> dict:
    """Run every point of ``run`` (seeds x grid: ``run.points``) as federations, programs of as many as fit
    (`experiments_per_call`); write each folder and
    sweep.json/.md. The sweep's folder and every point's are held (locked) for the whole sweep
    (outputs/folder_claim.py).

    ``stop``: the Ctrl-C and SIGTERM handling to use (after either no further program starts); ``start_over``:
    replace the runs the points' folders hold."""
    require_valid(run, "run_sweep")
    if not run.points:
        raise TypeError("run_sweep takes a sweep (seeds or listed values); run_single runs one configuration")
    stop = stop or StopRequest()
    if resume:
        raise UserError("--resume continues one run: resume a point of a sweep in its own folder "
                        "(e.g. --out RUN/seed1 --resume)")
    points = list(run.points)
    root = run.out
    with contextlib.ExitStack() as held:
        held.enter_context(locked(root))
        for point in points:
            held.enter_context(claimed(point.out, checkpoint.has_checkpoint, start_over=start_over))
        return _run_points(run.checked, points, root, progress, stop, observe)


def _run_points(cfg: config_lib.RunConfig, points: list[ValidRun], root: Path, progress: bool, stop: StopRequest,
                observe) -> dict:
    """`run_sweep` once its folders are held."""
    for key, why in resolved_notes(cfg).items():  # what 'auto' became: data.name, model.name
        print(f"{key}: {why}", flush=True)
    built: dict = {}  # the points' experiments by partition, built once for every program
    exp = experiment_of(points[0], built, progress)
    print(exp.partition_text + ("; each seed draws its own partition (vary_data_with_seed)"
                                if cfg.vary_data_with_seed else ""), flush=True)
    per_call = experiments_per_call(exp.engine, cfg, len(points))
    print(exp.data.memory.for_runs(per_call, len(points)).line(), flush=True)
    print(f"{len(points)} runs, {per_call} per compiled program, on {jax.devices()[0].device_kind} "
          f"({jax.default_backend()}); {host_devices.describe(host_devices.record())} ...", flush=True)
    start = time.perf_counter()
    summaries: list[dict] = []
    mappings: dict = {}  # runs in a program -> the client mapping chosen for the first program of that size
    for i in range(0, len(points), per_call):
        chunk = points[i:i + per_call]
        program = FederationProgram(chunk, progress, built, mappings.get(len(chunk)),
                                    report=lambda line: print(line, flush=True))
        mappings.setdefault(len(chunk), program.mapping)
        summaries += run_program(program, program.exps, chunk, progress, stop, observe)
        if stop.requested:
            break
    if len(summaries) < len(points):  # stopped between two programs: which runs have their records
        print(results_writer.stopped_between([p.out for p in points], len(summaries), root))
    summary = sweep_summary(points[:len(summaries)], summaries)
    summary["seconds"] = time.perf_counter() - start
    run_output.write_json(root / "sweep.json", summary)
    with atomic_write(root / "sweep.md") as f:
        f.write(sweep_markdown(summary))
    print(sweep_markdown(summary), end="", flush=True)
    results_writer.draw_figures(root, lambda line: print(line, flush=True), stop.requested)
    print(f"wrote {root}/ ({len(summaries)} run folders, sweep.json, sweep.md)")
    return summary
