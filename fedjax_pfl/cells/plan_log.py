"""The log a background run plan leaves in its work folder, and what a later plan reads from it.

A plan that runs in the background (``--device-kind cpu``: slices of a few
hours at low priority beside other work) writes its cells into a work
folder outside the repository (`default_work_folder`), so a fresh clone of
the repository finds and resumes them. Each cell the plan's command starts,
finishes, or stops appends one JSON line to WORK/plan_log.jsonl
(`append`): the cell, the event, the rounds its run folder holds, the time.
The next plan reads it (`started_cells`): a cell the log says was started
whose run folder no longer holds a checkpoint or a finished run starts
again, and the plan says so (`gone_note`). The command's own output goes to
WORK/plan.log beside it.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from fedjax_pfl.data import files

NAME = "plan_log.jsonl"
OUTPUT = "plan.log"


def default_work_folder(table: str) -> Path:
    """Where a background plan of ``table`` keeps its cells: the user cache's cells/<table> (outside any
    checkout, so every clone of the repository finds the same runs)."""
    return files.cache_dir() / "cells" / table


def append(work: Path, cell: str, event: str, rounds_done: int) -> None:
    """One line: ``cell`` (``<method>-<setting>/seed<k>``) had ``event`` ('started', 'finished', 'stopped',
    'failed', 'collected') with ``rounds_done`` rounds in its run folder."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    line = {"cell": cell, "event": event, "rounds": int(rounds_done),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    with open(work / NAME, "a") as f:
        f.write(json.dumps(line) + "\n")


def read(work: Path) -> list[dict]:
    """The log's lines in order (none without a log; a damaged line, e.g. cut by a kill, is skipped)."""
    path = Path(work) / NAME
    if not path.is_file():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and isinstance(line.get("cell"), str):
            lines.append(line)
    return lines


def started_cells(work: Path) -> dict[str, dict]:
    """Cell -> its last line, for every cell the log names."""
    last: dict[str, dict] = {}
    for line in read(work):
        last[line["cell"]] = line
    return last


def gone_note(cell: str, last: dict) -> str:
    """Why ``cell`` starts again: the log saw it run, its checkpoints are gone."""
    return (f"{cell} starts again: the log saw it reach round {last.get('rounds', 0)} ({last.get('event')} at "
            f"{last.get('time')}), but its run folder holds no checkpoint now")
