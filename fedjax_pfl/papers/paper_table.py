"""A reproduced paper table: table.md and table.csv from the run folders of its cells.

One row per row of the paper's table, one column block per setting: ours,
the table's metric (report.py's ``best``, ``last`` or ``mean_last_10`` of a
run, the values of its summary.json, or their ``_weighted`` forms over the
test samples pooled across clients) as mean ± std over the seeds that have a
run (population std, ddof=0, as report.md) and their number; the paper's
number where the table file gives it; and the difference ours - paper in
percentage points, flagged (⚠) beyond ``paper_numbers.FLAG_POINTS``. A cell
without a paper number shows no difference. Settings with a ``group`` are
printed as one table per group. The header states the rounds and seeds
actually used and says "reduced" where they are fewer than the paper's; the
notes follow (the table file's ``notes``, then one line per dataset whose
files were missing), and a "Runs" section closes the file: each run's rounds,
minutes, status, commit, machine and jax version. table.csv has one line per
(row, setting) with fractions, not percent (the paper's number and the
difference too), and each run's value in the order of its folders.
Writing the table again keeps what the earlier table in the folder says of
cells whose run folders are absent here, and its hand-written preface
(`earlier_table`), pooling those runs, value by value, with the cell's
other seeds whose folders are here. Nothing here imports JAX.
"""

from __future__ import annotations

import math
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import run_folder
from fedjax_pfl.outputs.report import load_run, mean_std, write_csv
from fedjax_pfl.papers.table_spec import METRICS, NO_DATA, Cell, MethodRow, Setting, TableSpec
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.papers.paper_numbers import FLAG_POINTS, difference, flagged
from fedjax_pfl.papers.earlier_table import EarlierTable, kept_ours, read_earlier, values_column


def _fraction(value):
    return None if value is None else value / 100


_NOTHING_KEPT = {"runs": 0, "seeds": "", "rounds": "", "folders": "", "values": {}}  # `ours` for a cell with no kept runs


def ours(spec: TableSpec, cells: list[Cell], runs_dir: Path, no_data: bool = False, kept: dict | None = None) -> dict:
    """The "ours" fields of one (row, setting) from the runs of its seeds that exist (``cells``: its run row's),
    with ``kept``, the earlier table's finished runs of seeds whose folders are not here (`kept_cells`): as
    that table gives them when no seed has a folder here, else pooled with those that have, run by run."""
    runs = [load_run(runs_dir / c.folder_name) for c in cells if run_folder.is_run(runs_dir / c.folder_name)]
    kept = kept or _NOTHING_KEPT
    metrics = {values_column("" if m == spec.metric else m): m for m in (spec.metric, *spec.also_metrics)}
    values = {col: (kept["values"] or {}).get(col, []) + [getattr(r, m) for r in runs] for col, m in metrics.items()}
    if runs or not kept["runs"]:
        means = {col: mean_std(v) for col, v in values.items()}
    else:  # the earlier line as it is, its mean and std as written
        means = {col: (kept["mean"], kept["std"]) if col == "values" else (kept[f"{m}_mean"], kept[f"{m}_std"])
                 for col, m in metrics.items()}
    statuses = ([r.status for r in runs] + ["finished"] * kept["runs"]
                + [NO_DATA if no_data else "not run"] * (len(cells) - len(runs) - kept["runs"]))
    seeds = [s for s in kept["seeds"].split(", ") if s] + [str(r.config.get("seed")) for r in runs]
    folders = [f for f in kept["folders"].split(";") if f] + [str(Path(r.path).relative_to(runs_dir.parent))
                                                               for r in runs]
    order = sorted(range(len(seeds)), key=lambda i: int(seeds[i]) if seeds[i].isdigit() else -1)
    return {"runs": len(runs) + kept["runs"], "mean": means["values"][0], "std": means["values"][1],
            **{f"{m}_{k}": means[col][i] for col, m in metrics.items() if col != "values"
               for i, k in enumerate(("mean", "std"))},
            "seeds": ", ".join(seeds[i] for i in order),
            "rounds": ", ".join(dict.fromkeys([r for r in kept["rounds"].split(", ") if r]
                                              + [str(r.rounds_done) for r in runs])),
            "status": ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)),
            "folders": ";".join(folders[i] for i in order),  # from table.csv
            **{col: ";".join(repr(v[i]) for i in order) if len(v) == len(folders) else ""
               for col, v in values.items()}}


def _kept_to_pool(key: tuple, found: dict, cells: list[Cell], runs_dir: Path) -> dict | None:
    """The runs of the earlier line ``found`` whose folders are not here, to pool with the cell's run folders
    here (`ours`); None when all its folders are here (they stand for the cell); a UserError when its values
    columns are empty, so the mean cannot be taken apart."""
    here = {c.folder_name for c in cells if (c.method.name, c.setting.name) == key
            and run_folder.is_run(runs_dir / c.folder_name)}
    folders = [f for f in found["folders"].split(";") if f]
    absent = [i for i, f in enumerate(folders) if Path(f).relative_to("runs").as_posix() not in here]
    if not absent:
        return None
    if found["values"] is None:
        raise UserError(f"{key[0]}/{key[1]}: the earlier table holds seeds whose folders "
                        f"({', '.join(folders[i] for i in absent)}) are not under {runs_dir.parent} inside a mean "
                        "without its runs' values, beside run folders of this cell here; bring those folders "
                        "into runs/, then write the table again")
    seeds = [s for s in found["seeds"].split(", ") if s]
    return {**found, "runs": len(absent), "seeds": ", ".join(seeds[i] for i in absent),
            "folders": ";".join(folders[i] for i in absent), "status": f"{len(absent)} finished",
            "values": {col: [v[i] for i in absent] for col, v in found["values"].items()}}


def entry(spec: TableSpec, row: MethodRow, setting: Setting, found: dict) -> dict:
    """The CSV line of one (row, setting): ``found`` (`ours`, or kept from the earlier table) with the paper's
    number and the difference."""
    paper = spec.paper_value(row.name, setting.name)
    diff = difference(found["mean"], paper)
    return {"table": spec.name, "method": row.name, "label": row.shown, "runs": found["runs"],
            "setting": setting.name, "group": setting.group, "column": setting.column, "metric": spec.metric,
            "mean": found["mean"], "std": found["std"], "paper": _fraction(paper and paper.mean),
            "paper_std": _fraction(paper and paper.std), "diff": _fraction(diff), "flag": flagged(diff),
            **{f"{m}_mean": found[f"{m}_mean"] for m in spec.also_metrics if m != spec.metric},
            **{f"{m}_std": found[f"{m}_std"] for m in spec.also_metrics if m != spec.metric},
            **{k: found[k] for k in ("seeds", "rounds", "status", "folders")},
            **{values_column(m): found[values_column(m)] for m in ("", *spec.also_metrics) if m != spec.metric}}


def entries(spec: TableSpec, cells: list[Cell], runs_dir: Path, no_data=frozenset(), kept=None) -> list[dict]:
    """One line per (shown row, setting) of ``cells``, rows outermost; ``no_data``: settings without files;
    ``kept``: (run row, setting) -> "ours" fields for cells without runs here (`kept_cells`)."""
    kept = kept or {}
    groups: dict[tuple, list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.method.name, c.setting.name), []).append(c)
    settings = {c.setting.name: c.setting for c in cells}
    found = {key: ours(spec, group, runs_dir, key[1] in no_data, kept.get(key)) for key, group in groups.items()}
    rows = spec.shown_rows({c.method.name for c in cells})
    return [entry(spec, row, setting, found.get((spec.run_row(row).name, name)) or ours(spec, [], runs_dir))
            for row in rows for name, setting in settings.items()]  # (a row that does not run in a setting: none)


def kept_cells(spec: TableSpec, cells: list[Cell], runs_dir: Path, earlier: EarlierTable, rounds: dict,
               seeds: list[int]) -> dict:
    """(run row, setting) -> the earlier table's "ours" fields of the cell, where its line counts finished runs
    of the rounds used now (`earlier_table.kept_ours`) whose folders are not here; `ours` pools them with the
    cell's run folders here, if any (`_kept_to_pool`)."""
    here = {(c.method.name, c.setting.name) for c in cells if run_folder.is_run(runs_dir / c.folder_name)}
    kept = {}
    for key in dict.fromkeys((c.method.name, c.setting.name) for c in cells):
        found = kept_ours(earlier.lines.get(key), spec.metric, rounds[key[1]][0], seeds,
                          [m for m in spec.also_metrics if m != spec.metric])
        if found and key in here:
            found = _kept_to_pool(key, found, cells, runs_dir)
        if found:
            kept[key] = found
    return kept


def ours_cell(e: dict, metric: str = "") -> str:
    """``mean ± std (n=k)`` in percent, with the seeds' state when not all finished; '-' without runs."""
    mean, std = (e["mean"], e["std"]) if not metric else (e[f"{metric}_mean"], e[f"{metric}_std"])
    text = f"{100 * mean:.2f} ± {100 * std:.2f} (n={e['runs']})" if math.isfinite(mean) else "-"
    if e["status"] and e["status"] != f"{e['runs']} finished":  # say when seeds are missing, unfinished or failed
        # (no status: the row does not run in this setting, its spec's 'settings'; the notes say why)
        text += f" ({e['status']})"
    return text


def paper_cell(e: dict) -> str:
    if e["paper"] is None:
        return "-"
    return f"{100 * e['paper']:.2f}" + ("" if e["paper_std"] is None else f" ± {100 * e['paper_std']:.2f}")


def diff_cell(e: dict) -> str:
    """Ours - paper in points with a sign, ⚠ when flagged; '-' without both numbers."""
    if e["diff"] is None:
        return "-"
    return f"{100 * e['diff']:+.2f}" + (" ⚠" if e["flag"] else "")


def rounds_line(rounds: dict) -> str:
    """``rounds`` maps setting -> (used, paper's): the settings grouped by their rounds."""
    by_rounds: dict[tuple, list[str]] = {}
    for setting, pair in rounds.items():
        by_rounds.setdefault(pair, []).append(setting)
    parts = [f"{used}" + (f" of {paper} (reduced)" if used < paper else "")
             + ("" if len(by_rounds) == 1 else f" ({', '.join(settings)})")
             for (used, paper), settings in by_rounds.items()]
    return f"Rounds: {'; '.join(parts)}."


def accuracy_text(metric: str) -> str:
    """How a round's accuracy pools the clients under ``metric``."""
    if metric.endswith("_weighted"):
        return ("of the test samples pooled over clients (sum of correct predictions / sum of test samples, "
                "i.e. each client's test accuracy weighted by its test samples)")
    return "of the unweighted mean over clients of each client's test accuracy"


def header(spec: TableSpec, rounds: dict, seeds: list[int], extra: list[str] = (), preface: list[str] = ()) -> list[str]:
    """Title, ``preface`` (hand-written, kept from the earlier table) and the lines that say what was run:
    ``rounds`` maps setting -> (used, paper's); ``extra`` lines."""
    seeds_text = ", ".join(map(str, seeds))
    if len(seeds) < len(spec.seeds):
        seeds_text += f" (reduced; the table file's seeds: {', '.join(map(str, spec.seeds))})"
    return [f"# {spec.paper}, {spec.table}: reproduced with fedjax_pfl", "", *preface, *([""] if preface else []),
            f"Accuracy (%): {METRICS[spec.metric]} ({spec.metric}) {accuracy_text(spec.metric)} with the model "
            "its method evaluates (eval.model: personalized, or global for FedAvg-style methods).",
            f"Each cell: ours = mean ± std over the n seeds run (ddof=0); paper = the published number; "
            f"Δ = ours − paper in points, ⚠ where |Δ| > {FLAG_POINTS}; '-' = none.",
            rounds_line(rounds), f"Seeds: {seeds_text}.", *extra, ""]


def block(lines: list[dict], metric: str = "") -> list[str]:
    """One Markdown table: rows as printed, per setting ours (and paper and Δ when any paper number is given)."""
    columns = list(dict.fromkeys(e["column"] for e in lines))
    with_paper = not metric and any(e["paper"] is not None for e in lines)
    heads = [h for c in columns for h in ([f"{c} ours", f"{c} paper", f"{c} Δ"] if with_paper else [c])]
    out = ["| method | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for label in dict.fromkeys(e["label"] for e in lines):
        values = [v for e in lines if e["label"] == label
                  for v in ([ours_cell(e), paper_cell(e), diff_cell(e)] if with_paper else [ours_cell(e, metric)])]
        out.append(f"| {label} | " + " | ".join(values) + " |")
    return out


def runs_section(cells: list[Cell], runs_dir: Path, kept_rows: dict[str, str] | None = None) -> list[str]:
    """'## Runs': one line per run folder present (cell, rounds done, minutes, status, and the commit(s),
    machine and jax version its config.json records), or its line in ``kept_rows`` (run folder -> line, from
    the earlier table); nothing when no cell has a run."""
    lines = []
    for c in cells:
        folder = runs_dir / c.folder_name
        if not run_folder.is_run(folder):
            lines += [kept_rows[c.folder_name]] if c.folder_name in (kept_rows or {}) else []
            continue
        run, made = load_run(folder), run_folder.read_provenance(folder)
        minutes = "-" if run.wall_seconds is None else f"{run.wall_seconds / 60:.1f}"
        lines.append(f"| {c.folder_name} | {run.rounds_done} | {minutes} | {run.status} | "
                     f"{', '.join(made['commits'])} | {', '.join(made['machines'])} | {', '.join(made['jax'])} |")
    if not lines:
        return []
    return ["## Runs", "",
            "Minutes: each run's own clock (its rounds, compiling included, summed over resumed segments; other "
            "work on the machine slows it). Commit, machine and jax: as the run's config.json records them, for "
            "every segment of a resumed run. Each cell's training command: the same reproduce command with "
            "--dry-run.", "",
            "| run | rounds | minutes | status | commit | machine | jax |", "|---|---|---|---|---|---|---|",
            *lines, ""]


def markdown(spec: TableSpec, lines: list[dict], head: list[str], notes: list[str] = (),
             runs: list[str] = ()) -> str:
    """The header, one table per group of settings (a '## group' heading when there are groups), the
    ``also_metrics`` tables (ours only), the notes and the ``runs`` section (`runs_section`)."""
    out = list(head)
    for group in dict.fromkeys(e["group"] for e in lines):
        out += ([f"## {group}", ""] if group else []) + block([e for e in lines if e["group"] == group]) + [""]
    for metric in spec.also_metrics:
        out += [f"## Also: {METRICS[metric]} ({metric}), no paper numbers", ""]
        out += block([{**e, "column": f"{e['group']} {e['column']}".strip()} for e in lines], metric) + [""]
    notes = [n for n in (spec.notes, *notes) if n]
    if notes:
        out += ["## Notes", "", *[line for n in notes for line in (n, "")]]
    out += runs
    return "\n".join(out).rstrip("\n") + "\n"


def write_table(spec: TableSpec, cells: list[Cell], out: Path, rounds: dict, seeds: list[int],
                extra: list[str] = (), no_data: dict | None = None, notes: list[str] = ()) -> str:
    """Write table.md and table.csv into ``out`` (runs under out/runs); returns the markdown.

    ``no_data`` maps a setting whose dataset files are missing to the reason (one note line per reason);
    ``notes``: more notes, after the table file's."""
    no_data = no_data or {}
    earlier = read_earlier(out)
    kept = kept_cells(spec, cells, out / "runs", earlier, rounds, seeds)
    lines = entries(spec, cells, out / "runs", set(no_data), kept)
    kept_runs = [Path(f).relative_to("runs").as_posix() for k in kept.values() for f in k["folders"].split(";") if f]
    if kept:
        extra = [*extra, f"Kept from the table written here before ({len(kept_runs)} runs whose folders are not "
                 f"here, their results and Runs lines as that table gives them): {', '.join(kept_runs)}."]
    reasons: dict[str, list[str]] = {}
    for setting, reason in no_data.items():
        reasons.setdefault(reason, []).append(setting)
    notes = [*notes, *(f"Not run, dataset files missing ({', '.join(s)}): {r}; supply them (--data-dir DIR) and run "
                       "the same command again." for r, s in reasons.items())]
    kept_rows = {name: row for name, row in earlier.run_rows.items() if name in kept_runs}
    text = markdown(spec, lines, header(spec, rounds, seeds, extra, earlier.preface), notes,
                    runs_section(cells, out / "runs", kept_rows))
    with atomic_write(out / "table.md") as f:
        f.write(text)
    write_csv(out / "table.csv", lines)
    return text
