"""A reproduced paper table: table.md and table.csv from the run folders of its cells.

One row per method, one column per setting; each entry is the table's metric
(report.py's ``best``, ``last`` or ``mean_last_10`` of a run, the values of
its summary.json) as mean ± std over the seeds that have a run (population
std, ddof=0, as report.md), beside the paper's number where the table file
gives it. The header states the rounds and seeds actually used and says
"reduced" where they are fewer than the paper's. table.csv has one line per
(method, setting) with fractions, not percent. Nothing here imports JAX.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_pfl.runs import run_folder
from fedjax_pfl.runs.report import format_percent, load_run, mean_std, write_csv
from fedjax_pfl.runs.table_spec import METRICS, Cell, TableSpec
from fedjax_pfl.runs.atomic_file import atomic_write


def entry(spec: TableSpec, cells: list[Cell], runs_dir: Path) -> dict:
    """The CSV line of one (method, setting) from the runs of its seeds that exist."""
    first = cells[0]
    runs = [load_run(runs_dir / c.folder_name) for c in cells if run_folder.is_run(runs_dir / c.folder_name)]
    mean, std = mean_std([getattr(r, spec.metric) for r in runs])
    statuses = [r.status for r in runs] + ["not run"] * (len(cells) - len(runs))
    return {"table": spec.name, "method": first.method.name, "setting": first.setting.name, "metric": spec.metric,
            "mean": mean, "std": std, "runs": len(runs),
            "seeds": ", ".join(str(r.config.get("seed")) for r in runs),
            "rounds": ", ".join(dict.fromkeys(str(r.rounds_done) for r in runs)),
            "status": ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)),
            "paper": spec.paper_value(first.method.name, first.setting.name),
            "folders": ";".join(str(r.path) for r in runs)}


def entries(spec: TableSpec, cells: list[Cell], runs_dir: Path) -> list[dict]:
    """One line per (method, setting) of ``cells``, methods outermost."""
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.method.name, c.setting.name), []).append(c)
    return [entry(spec, group, runs_dir) for group in groups.values()]


def _paper_cell(value) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def header(spec: TableSpec, rounds: dict, seeds: list[int], extra: list[str] = ()) -> list[str]:
    """Title and the lines that say what was run: ``rounds`` maps setting -> (used, paper's); ``extra`` lines."""
    reduced_rounds = [f"{s}: {used} of {paper} (reduced)" if used < paper else f"{s}: {used}"
                      for s, (used, paper) in rounds.items()]
    seeds_text = ", ".join(map(str, seeds))
    if len(seeds) < len(spec.seeds):
        seeds_text += f" (reduced; the table file's seeds: {', '.join(map(str, spec.seeds))})"
    return [f"# {spec.paper}, {spec.table}: reproduced with fedjax_pfl", "",
            f"Accuracy (%): {METRICS[spec.metric]} ({spec.metric}) of the unweighted mean over clients of each "
            "client's test accuracy with the model its method evaluates (eval.model: personalized, or global for "
            "FedAvg-style methods); mean ± std over seeds (ddof=0).",
            f"Rounds: {'; '.join(reduced_rounds)}.", f"Seeds: {seeds_text}.",
            *extra, *([spec.note] if spec.note else []), ""]


def markdown(spec: TableSpec, lines: list[dict], head: list[str]) -> str:
    """Methods as rows, settings as columns (each with the paper's number beside it when the file gives any)."""
    settings = list(dict.fromkeys(e["setting"] for e in lines))
    methods = list(dict.fromkeys(e["method"] for e in lines))
    by_key = {(e["method"], e["setting"]): e for e in lines}
    with_paper = any(e["paper"] is not None for e in lines)
    columns = [c for s in settings for c in ([f"{s} paper", f"{s} fedjax_pfl"] if with_paper else [s])]
    out = [*head, "| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for m in methods:
        values = []
        for s in settings:
            e = by_key[(m, s)]
            ours = format_percent(e["mean"], e["std"], e["runs"]) if np.isfinite(e["mean"]) else "-"
            if e["status"] != f"{e['runs']} finished":  # say when seeds are missing, unfinished or failed
                ours += f" ({e['status']})"
            values += [_paper_cell(e["paper"]), ours] if with_paper else [ours]
        out.append(f"| {m} | " + " | ".join(values) + " |")
    return "\n".join(out) + "\n"


def write_table(spec: TableSpec, cells: list[Cell], out: Path, rounds: dict, seeds: list[int],
                extra: list[str] = ()) -> str:
    """Write table.md and table.csv into ``out`` (runs under out/runs); returns the markdown."""
    lines = entries(spec, cells, out / "runs")
    text = markdown(spec, lines, header(spec, rounds, seeds, extra))
    with atomic_write(out / "table.md") as f:
        f.write(text)
    write_csv(out / "table.csv", lines)
    return text
