"""The tau sweeps' short table: per point, accuracy and how the server step read the models at the last round.

    python reproductions/diversifed_table2/sweeps/tau_table.py FOLDER [FOLDER ...] > tau_table.md

Each FOLDER holds a sweep's point folders (<point>/seed0/ with config.json and metrics.jsonl or
metrics.jsonl.xz). Columns: the point's alpha, distance unit, eta and tau; test accuracy, best round
(the table's metric) and mean of the last 10 evaluations; validation accuracy, mean of the last 10;
then the last round's diagnostics (methods/diversifed.py): softmax entropy mean and min (nats;
log 39 = 3.66 is uniform), rows whose step was cut (of 40), the share of models merged (nearest other
model within 1% of the mean distance), the mean growth of the largest distance over the last 10
rounds, the mean distance of the pulled and of the pushed pairs in units of the mean distance, the
self-weight and the mean distance.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path


def records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    text = path.read_text() if path.is_file() else lzma.open(run / "metrics.jsonl.xz", "rt").read()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def row(run: Path) -> list[str]:
    config = json.loads((run / "config.json").read_text())["config"]
    method, rows = config["method"], records(run)
    evaluated = [r for r in rows if "accuracy" in r] or [{"round": 0, "accuracy": float("nan")}]
    best = max(evaluated, key=lambda r: r["accuracy"])
    last10 = evaluated[-10:]
    d = rows[-1]["diagnostics"]
    growth = sum(r["diagnostics"]["distance_max_growth"] for r in rows[-10:]) / len(rows[-10:])
    cells = [config["partition"]["alpha"], method.get("distance_unit", "raw"), method["eta"], method["tau"],
             f"{100 * best['accuracy']:.2f} (r{best['round']})",
             f"{100 * sum(r['accuracy'] for r in last10) / len(last10):.2f}",
             f"{100 * sum(r.get('val_accuracy', float('nan')) for r in last10) / len(last10):.2f}",
             f"{d['softmax_entropy_mean']:.2f} / {d['softmax_entropy_min']:.2f}", f"{d['bound_rows']:.0f}",
             f"{d['merged_fraction']:.3f}", f"{growth:.2f}", f"{d['pulled_distance']:.3f}",
             f"{d['pushed_distance']:.3f}", f"{d['self_weight']:.3f}", f"{d['distance_mean']:.1f}",
             str(rows[-1]["round"])]
    return [str(c) for c in cells]


HEADER = ["alpha", "unit", "eta", "tau", "test best (round)", "test last 10", "val last 10",
          "entropy mean / min", "rows cut", "merged", "max growth", "pulled d", "pushed d", "self-weight",
          "mean d", "rounds"]


def main(folders: list[str]) -> None:
    runs = sorted(run for folder in folders for run in Path(folder).glob("*/seed0") if (run / "config.json").is_file())
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row(run)) + " |" for run in runs]
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
