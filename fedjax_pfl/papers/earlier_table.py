"""The table a reproduction wrote before: what of it stays when the table is written where its runs are absent.

A reproduction's run folders may live on the machine that ran them only (a
fresh clone, or cells split over machines), while table.md and table.csv
travel with the repository. Writing the table again there must not drop the
cells run elsewhere, so `paper_table` reads the table already in the output
folder (`read_earlier`):

- ``lines``: table.csv's line per (row, setting). A cell with no run folder
  here keeps its "ours" part (mean, std, seeds, rounds, status, folders;
  `kept_ours`) when that line counted finished runs only, of the rounds and
  metric used now, on seeds among those asked for; the paper's number and the
  difference are computed afresh from the table file. Its per-run values
  (``values``, one per folder) let `paper_table` pool those runs with the
  cell's other seeds whose folders are here. table.csv does not
  record a cell's full configuration, so, unlike a run folder (`reproduce`
  refuses one of another configuration), a kept line is not checked against
  the table file's overrides: after changing those, remove the table files.
- ``run_rows``: the lines of table.md's "## Runs" section by run folder, for
  the runs of those cells.
- ``preface``: the paragraphs between the title and the "Accuracy (%)" line,
  a hand-written account of how the cells were run, kept as written.

Nothing here imports JAX.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

ACCURACY_LINE = "Accuracy (%):"
#: the fields of a csv line that describe our runs (the rest comes from the table file)
OURS = ("runs", "mean", "std", "seeds", "rounds", "status", "folders")


@dataclass
class EarlierTable:
    lines: dict[tuple[str, str], dict] = field(default_factory=dict)  # (method, setting) -> csv line
    run_rows: dict[str, str] = field(default_factory=dict)  # run folder below runs/ -> its Runs line
    preface: list[str] = field(default_factory=list)


def read_earlier(out: Path) -> EarlierTable:
    """What table.csv and table.md in ``out`` hold; empty where they are absent."""
    earlier = EarlierTable()
    csv_path, md_path = Path(out) / "table.csv", Path(out) / "table.md"
    if csv_path.is_file():
        with open(csv_path, newline="") as f:
            earlier.lines = {(r["method"], r["setting"]): r for r in csv.DictReader(f)}
    if md_path.is_file():
        text = md_path.read_text().splitlines()
        earlier.preface = preface(text)
        earlier.run_rows = run_rows(text)
    return earlier


def preface(lines: list[str]) -> list[str]:
    """The lines between the title and the "Accuracy (%)" line, without blank lines at either end."""
    if not lines or not lines[0].startswith("# "):
        return []
    end = next((i for i, line in enumerate(lines) if line.startswith(ACCURACY_LINE)), 1)
    body = lines[1:end]
    while body and not body[0].strip():
        body = body[1:]
    while body and not body[-1].strip():
        body = body[:-1]
    return body


def run_rows(lines: list[str]) -> dict[str, str]:
    """Run folder -> its line in the "## Runs" section."""
    try:
        start = lines.index("## Runs")
    except ValueError:
        return {}
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("run", "") and not set(cells[0]) <= set("-"):
            rows[cells[0]] = line
    return rows


def only_finished(status: str, runs: int) -> bool:
    """Whether a status says ``runs`` finished runs and nothing else but seeds never run.

    >>> only_finished("2 finished", 2), only_finished("2 finished, 1 not run", 2)
    (True, True)
    >>> only_finished("1 finished, 1 interrupted", 1)
    False
    """
    first, *rest = [part.strip() for part in status.split(",")]
    return first == f"{runs} finished" and all(re.fullmatch(r"\d+ not run", part) for part in rest)


def kept_ours(line: dict | None, metric: str, rounds: int, seeds: list[int], also_metrics=()) -> dict | None:
    """The "ours" fields of an earlier csv line (numbers parsed), or None when it cannot stand for the cell now:
    no finished runs, a run not finished, another metric or rounds, or seeds outside ``seeds``. Seeds the
    earlier table asked for but did not run (its "k not run") are left out of the kept status, which
    `paper_table.kept_cells` counts again for the seeds asked for now."""
    if not line or line.get("metric") != metric or not line.get("runs", "0").isdigit():
        return None
    runs = int(line["runs"])
    seeds_run = [s.strip() for s in line.get("seeds", "").split(",") if s.strip()]
    if (runs == 0 or not only_finished(line.get("status", ""), runs) or line.get("rounds") != str(rounds)
            or not set(seeds_run) <= {str(s) for s in seeds}):
        return None
    kept = {k: line[k] for k in OURS}
    kept["runs"] = runs
    kept["status"] = f"{runs} finished"
    for name in ("mean", "std", *[f"{m}_{s}" for m in also_metrics for s in ("mean", "std")]):
        kept[name] = float(line.get(name) or "nan")
    kept["values"] = run_values(line, runs, also_metrics)
    return kept


def values_column(metric: str = "") -> str:
    """table.csv's column of each run's value, in the order of its folders: ``values`` for the table's metric,
    ``{metric}_values`` for another."""
    return f"{metric}_values" if metric else "values"


def run_values(line: dict, runs: int, also_metrics=()) -> dict[str, list[float]] | None:
    """Each run's value per values column (`values_column`) of a csv line with ``runs`` runs; None where a
    column is empty or holds another number of values.

    >>> run_values({"values": "0.5;0.7", "best_values": "0.6;0.8"}, 2, ["best"])
    {'values': [0.5, 0.7], 'best_values': [0.6, 0.8]}
    >>> run_values({"values": "0.5", "best_values": ""}, 1, ["best"]), run_values({"values": "0.5"}, 2)
    (None, None)
    """
    out = {}
    for metric in ("", *also_metrics):
        text = line.get(values_column(metric)) or ""
        values = [float(v) for v in text.split(";")] if text else None
        if values is None or len(values) != runs:
            return None
        out[values_column(metric)] = values
    return out
