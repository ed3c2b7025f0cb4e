"""A stopped run folder made a compact record: config.json, summary.json and metrics.jsonl.xz.

A reproduction commits its runs so its table can be written again from any
clone. What the table and the report read of a run is its config.json (the
configuration and where the run came from), its summary.json (the status)
and, per evaluation, the keys `metrics_file.COMPACT_KEYS`. `compact_run`
writes those into `metrics_file.COMPACT` (each value as metrics.jsonl has
it, so every number reads back exactly; checked before anything is removed)
and removes `DROPPED`: metrics.jsonl, its copy metrics.csv, partition.json
and clients.csv. Files that are not records (checkpoint/, plots/, error.log)
are left as they are.

Only a run that stopped for good is compacted: summary.json says finished
or failed, as `reproduce` counts a finished cell. An interrupted or
unfinished run stays whole, so it can still be resumed; a compact record
cannot be (runs/resume.py says so).
"""

from __future__ import annotations

import json
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import metrics_file, run_folder

STOPPED = ("finished", "failed")
DROPPED = ("metrics.csv", "partition.json", "clients.csv", metrics_file.NAME)  # metrics.jsonl last


def is_compact(run_dir: Path) -> bool:
    return metrics_file.run_metrics(run_dir).name == metrics_file.COMPACT


def compactable(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a whole run that stopped for good (summary.json: finished or failed)."""
    summary = run_folder.read_summary(run_dir) or {}
    return summary.get("status") in STOPPED and (Path(run_dir) / metrics_file.NAME).is_file()


def compact_run(run_dir: Path) -> None:
    """Make the stopped run in ``run_dir`` a compact record (see the module docstring); UserError when its
    metrics.jsonl has damaged lines (compacting would drop them silently)."""
    run_dir = Path(run_dir)
    metrics = metrics_file.read_metrics(run_dir / metrics_file.NAME)
    if metrics.damaged:
        raise UserError(f"{metrics.warning()}; mend or remove those lines before compacting {run_dir}")
    compact = run_dir / metrics_file.COMPACT
    metrics_file.write_compact(compact, metrics.records)
    read_back = metrics_file.read_metrics(compact).records
    if metrics_file.compact_lines(read_back) != metrics_file.compact_lines(metrics.records):
        compact.unlink()
        raise UserError(f"{compact} does not read back as {run_dir}/metrics.jsonl; nothing was removed")
    for name in DROPPED:
        (run_dir / name).unlink(missing_ok=True)


def compact_runs(folder: Path) -> dict[str, list[Path]]:
    """Compact every stopped run folder at or below ``folder`` -> {"compacted", "already", "whole"}: the run
    folders compacted now, those compact before, and those left whole (interrupted or unfinished)."""
    found = {"compacted": [], "already": [], "whole": []}
    runs = sorted(p.parent for p in Path(folder).rglob("config.json") if run_folder.is_run(p.parent)
                  and _written_by_a_run(p))
    for run in runs:
        if is_compact(run):
            found["already"].append(run)
        elif compactable(run):
            compact_run(run)
            found["compacted"].append(run)
        else:
            found["whole"].append(run)
    return found


def _written_by_a_run(config_json: Path) -> bool:
    """config.json of a run folder (its ``config`` section), not another tool's file of that name."""
    try:
        return isinstance(json.loads(config_json.read_text()).get("config"), dict)
    except (OSError, ValueError, AttributeError):
        return False
