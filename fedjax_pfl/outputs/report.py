"""Runs side by side (the command ``python -m fedjax_pfl.report``: commands/report.py).

Reads run folders (or folders holding runs) written by the training command,
finished, failed or interrupted alike, and writes into ``--out``:
- report.md (also printed) and report.csv: one row per group of runs whose
  configurations differ only in the seed (and in settings that cannot change
  the numbers: output folder, data folder, checkpoint interval, logging), with
  the last evaluation, the mean of the last 10 evaluations and the best
  evaluation as mean +- std over seeds (population std, ddof=0, as PFLlib's
  result tables), rounds done, wall time in the round loop and status; two
  folders of one configuration and seed count once (with a warning);
- accuracy.png: each group's accuracy curve (mean over seeds, +- std band).
Accuracy is the unweighted mean over clients of each client's test accuracy
(metrics.jsonl ``accuracy``); report.csv keeps fractions, report.md shows %.
``--redraw`` also (re)draws each run's own plots/ from its files, e.g. for
runs trained without matplotlib. Bad input is a one-line error, exit 2.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from fedjax_pfl.outputs.run_output import final_summary
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.outputs.results_writer import matplotlib_available
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.outputs.metrics_file import read_metrics, run_metrics

# config keys that never change a run's numbers (dotted; a key here also hides its sub-keys)
NOT_RESULT_SETTINGS = ("seed", "out", "data.data_dir", "data.allow_download", "checkpoint_every", "log")
# config keys already shown in the table's own columns
SHOWN = ("method_name", "data.name", "model.name", "model.hidden", "partition.scheme", "partition.num_clients",
         "partition.alpha", "partition.classes_per_client")
METRICS = ("last", "mean_last_10", "best")


@dataclasses.dataclass
class RunResult:
    path: Path
    config: dict
    status: str  # finished | failed | interrupted (summary.json) | unfinished (none: running or killed)
    rounds_done: int
    last: float
    mean_last_10: float
    best: float
    wall_seconds: float | None
    rounds: np.ndarray  # the round (counted from 1) after which each evaluation ran
    accuracy: np.ndarray
    # The same three over the test samples pooled across clients (sum correct / sum samples, the accuracy
    # PFLlib-based code prints); `best_weighted` picks its round on that accuracy.
    last_weighted: float = float("nan")
    mean_last_10_weighted: float = float("nan")
    best_weighted: float = float("nan")


def load_run(path: Path) -> RunResult:
    """A run folder's results; a damaged metrics.jsonl line is reported on stderr and skipped."""
    config = run_folder.read_config(path)
    metrics = read_metrics(run_metrics(path))
    if metrics.warning():
        print("warning: " + metrics.warning(), file=sys.stderr)
    records = metrics.records
    summary = run_folder.read_summary(path)
    stats = final_summary(records)
    nan = float("nan")
    return RunResult(
        path=Path(path), config=config,
        status=summary["status"] if summary else "unfinished",
        rounds_done=records[-1]["round"] if records else 0,
        last=stats["last"]["accuracy"] if stats else nan,
        mean_last_10=stats["mean_last_10"]["accuracy"] if stats else nan,
        best=stats["best_optimistic"]["by_accuracy"]["accuracy"] if stats else nan,
        wall_seconds=run_folder.wall_seconds(records),
        rounds=np.array([r["round"] for r in records], int),
        accuracy=np.array([r["accuracy"] for r in records], float),
        last_weighted=stats["last"]["accuracy_weighted"] if stats else nan,
        mean_last_10_weighted=stats["mean_last_10"]["accuracy_weighted"] if stats else nan,
        best_weighted=stats["best_optimistic"]["by_accuracy_weighted"]["accuracy_weighted"] if stats else nan,
    )


def flatten(tree: dict, prefix: str = "") -> dict:
    """Nested config -> {'train.lr': 0.05, ...}."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _under(key: str, prefixes) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def result_settings(config: dict) -> dict:
    """The flattened config without the keys that cannot change the numbers."""
    return {k: v for k, v in flatten(config).items() if not _under(k, NOT_RESULT_SETTINGS)}


def group_runs(runs: list[RunResult]) -> list[list[RunResult]]:
    """Runs whose configurations differ only in the seed (see NOT_RESULT_SETTINGS), in order of first appearance.

    Two runs of one configuration with the same seed (a copied folder) are
    one run, not two seeds: the later one is left out, with a warning.
    """
    groups: dict[str, dict] = {}
    for run in runs:
        key = json.dumps(result_settings(run.config), sort_keys=True, default=str)
        seeds = groups.setdefault(key, {})
        seed = run.config.get("seed", 0)
        if seed in seeds:
            print(f"warning: {seeds[seed].path} and {run.path} hold the same configuration with the same seed {seed} "
                  f"(a copy?); the report counts it once, from {seeds[seed].path}", file=sys.stderr)
            continue
        seeds[seed] = run
    return [[g[s] for s in sorted(g)] for g in groups.values()]


def mean_std(values) -> tuple[float, float]:
    """Mean and population std (ddof=0) of the finite values; NaN when there are none."""
    values = np.asarray(values, float)
    values = values[np.isfinite(values)]
    if not values.size:
        return float("nan"), float("nan")
    return float(values.mean()), float(values.std())


def varying_settings(groups: list[list[RunResult]]) -> list[str]:
    """Config keys (besides those in the table's own columns) whose value differs between groups."""
    settings = [result_settings(g[0].config) for g in groups]
    keys = sorted({k for s in settings for k in s})
    return [k for k in keys if not _under(k, SHOWN) and len({json.dumps(s.get(k), default=str) for s in settings}) > 1]


def _join_unique(values) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values))


def group_row(group: list[RunResult], varying: list[str]) -> dict:
    """One table row (numbers as fractions and seconds) for a group of seeds."""
    first = group[0]
    settings = result_settings(first.config)
    planned = first.config.get("train", {}).get("rounds")
    row = {**run_folder.describe(first.config),
           "settings": " ".join(f"{k}={json.dumps(settings[k], default=str)}" for k in varying if k in settings),
           "seeds": ", ".join(str(r.config.get("seed")) for r in group), "runs": len(group)}
    for metric in METRICS:
        row[f"{metric}_mean"], row[f"{metric}_std"] = mean_std([getattr(r, metric) for r in group])
    row["rounds"] = _join_unique(r.rounds_done if r.rounds_done == planned else f"{r.rounds_done}/{planned}"
                                 for r in group)
    walls = [r.wall_seconds for r in group if r.wall_seconds is not None]
    row["wall_seconds"] = float(np.mean(walls)) if walls else float("nan")
    statuses = [r.status for r in group]
    row["status"] = ", ".join(f"{statuses.count(s)} {s}" if len(group) > 1 else s for s in dict.fromkeys(statuses))
    row["folders"] = ";".join(str(r.path) for r in group)
    return row


def format_percent(mean: float, std: float, runs: int) -> str:
    if not np.isfinite(mean):
        return "-"
    return f"{100 * mean:.2f} ± {100 * std:.2f}" if runs > 1 else f"{100 * mean:.2f}"


def markdown(rows: list[dict]) -> str:
    show_settings = any(r["settings"] for r in rows)
    head = ["method", "dataset", "clients", "partition", "model", *(["settings"] if show_settings else []),
            "seeds", "last (%)", "mean last 10 (%)", "best (%)", "rounds", "wall (s)", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["method"], r["dataset"], r["clients"], r["partition"], r["model"],
                 *([r["settings"]] if show_settings else []), r["seeds"],
                 *(format_percent(r[f"{m}_mean"], r[f"{m}_std"], r["runs"]) for m in METRICS),
                 r["rounds"], f"{r['wall_seconds']:.0f}" if np.isfinite(r["wall_seconds"]) else "-", r["status"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append("")
    lines.append("Accuracy: unweighted mean over clients of the personalized models' test accuracy. last: final "
                 "evaluation; mean last 10: mean of the last 10 evaluations; best: highest evaluation (optimistic: "
                 "picks a round by test accuracy). Several seeds: mean ± std over seeds (ddof=0). wall: seconds in "
                 "the round loop, compilation included.")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[dict]) -> None:
    with atomic_write(path, newline="") as f:
        out = csv.DictWriter(f, list(rows[0]))
        out.writeheader()
        out.writerows(rows)


def group_curve(group: list[RunResult]) -> dict:
    """Mean (and std over seeds) of the accuracy at the rounds every run of the group evaluated."""
    common = sorted(set.intersection(*(set(r.rounds.tolist()) for r in group)))
    stacked = np.stack([r.accuracy[np.searchsorted(r.rounds, common)] for r in group]) if common else np.zeros((1, 0))
    return {"rounds": common, "mean": stacked.mean(0), "std": stacked.std(0) if len(group) > 1 else None}


def curve_labels(rows: list[dict]) -> tuple[list[str], str]:
    """Legend labels from the columns that differ between rows; the common columns make the title."""
    columns = ("method", "dataset", "clients", "partition", "model", "settings")
    differ = [c for c in columns if len({str(r[c]) for r in rows}) > 1] or ["method"]
    common = [c for c in columns if c not in differ and rows[0][c] not in ("", None)]
    labels = []
    for r in rows:
        label = ", ".join(str(r[c]) for c in differ if r[c] not in ("", None))
        if r["runs"] > 1:
            distinct_seeds = len(set(r["seeds"].split(", "))) == r["runs"]
            label += f" (mean ± std over {r['runs']} {'seeds' if distinct_seeds else 'runs'})"
        labels.append(label)
    title = ", ".join(f"{r}" if c != "clients" else f"{r} clients" for c, r in ((c, rows[0][c]) for c in common))
    return labels, title


def report(paths, out: Path, redraw: bool = False) -> str:
    """Write report.md, report.csv and accuracy.png into ``out``; returns the markdown."""
    runs = [load_run(p) for p in run_folder.find_runs(paths)]
    groups = group_runs(runs)
    varying = varying_settings(groups)
    rows = [group_row(g, varying) for g in groups]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows)
    with atomic_write(out / "report.md") as f:
        f.write(text)
    write_csv(out / "report.csv", rows)
    if not matplotlib_available():
        print("note: figures skipped, matplotlib is not installed (pip install 'fedjax_pfl[plots]')", file=sys.stderr)
        return text
    from fedjax_pfl.outputs import figures  # (imports matplotlib, an optional extra)

    labels, title = curve_labels(rows)
    curves = [{**group_curve(g), "label": label} for g, label in zip(groups, labels)]
    figures.save_png(figures.overlaid_accuracy(curves, title), out / "accuracy.png")
    if redraw:
        for run in runs:
            figures.draw_run(run.path / "plots", run_folder.read_records(run.path), run_folder.read_partition(run.path),
                             run_folder.read_clients(run.path), run_folder.title(run.config))
    return text
