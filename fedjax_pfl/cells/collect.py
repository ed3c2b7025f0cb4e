"""A finished cell carried from a plan's work folder into the table's folder as a compact record.

A background plan trains its cells in a work folder outside the repository
(cells/plan_log.py); the table lives in the repository (reproductions/NAME).
`collect_cell` copies a cell's run folder, once it finished, into the
table's runs/ as the compact record a reproduction commits (config.json,
summary.json, metrics.jsonl.xz: outputs/compact_record.py), leaving the
work folder's copy (and its checkpoints) as it is. The table is then written
again from the table's folder (cells/reproduce.py), so each finished cell
can be committed as soon as it finishes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import compact_record, metrics_file, run_folder

KEPT = ("config.json", "summary.json", metrics_file.NAME)


def collect_cell(work_run: Path, table_run: Path) -> bool:
    """Copy the finished run ``work_run`` to ``table_run`` as a compact record -> whether it copied (False: not
    finished, or the same record is there already). UserError when ``table_run`` holds another run."""
    work_run, table_run = Path(work_run), Path(table_run)
    if not compact_record.compactable(work_run):
        return False
    if run_folder.is_run(table_run):
        if run_folder.read_config(table_run) != run_folder.read_config(work_run):
            raise UserError(f"{table_run} holds another run than {work_run}; move it away to collect this one")
        if (run_folder.read_summary(table_run) or {}).get("status") in compact_record.STOPPED:
            return False
    staging = table_run.with_name(table_run.name + ".collecting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in KEPT:
        shutil.copy2(work_run / name, staging / name)
    compact_record.compact_run(staging)
    shutil.rmtree(table_run, ignore_errors=True)
    staging.rename(table_run)
    return True
