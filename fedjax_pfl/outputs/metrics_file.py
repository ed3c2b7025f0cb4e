"""metrics.jsonl: one JSON record per evaluation, appended and fsynced line by line; the one reader.

`read_metrics` returns every valid record and the numbers of the lines that
are not one (a write cut short by a kill leaves a torn last line; anything
else is damage), so that no caller silently stops at the first bad line:
the report warns and reads on, a resumed run decides whether it can go on
without losing a record (runs/resume.py). `MetricsLog` appends while a run
trains; `rewrite` replaces the file atomically (when resuming).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.outputs.run_output import jsonable


@dataclasses.dataclass
class MetricsFile:
    path: Path
    records: list[dict]  # the valid records, in file order
    damaged: list[int]  # 1-based numbers of the lines that are not a record
    line_of: list[int]  # line number of each valid record

    def warning(self) -> str | None:
        """One line naming the damaged lines, or None when there are none."""
        if not self.damaged:
            return None
        lines = ", ".join(map(str, self.damaged))
        return (f"{self.path} line{'s' if len(self.damaged) > 1 else ''} {lines} "
                f"{'are' if len(self.damaged) > 1 else 'is'} not a metrics record (damaged); "
                f"read the {len(self.records)} valid record(s)")


def parse_record(line: str) -> dict | None:
    """The record on one line, or None when it is not a JSON object with a whole-number ``round``."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("round"), int) or isinstance(record["round"], bool):
        return None
    return record


def read_metrics(path: Path) -> MetricsFile:
    """Every valid record of ``path`` (none when it does not exist) and the damaged lines' numbers."""
    path = Path(path)
    records, damaged, line_of = [], [], []
    if path.is_file():
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            record = parse_record(line)
            if record is None:
                damaged.append(number)
            else:
                records.append(record)
                line_of.append(number)
    return MetricsFile(path, records, damaged, line_of)


def line(record: dict) -> str:
    return json.dumps(record, default=jsonable) + "\n"


def rewrite(path: Path, records: list[dict]) -> None:
    """Replace ``path`` with exactly ``records`` (atomically)."""
    with atomic_write(path) as f:
        f.write("".join(line(r) for r in records))


class MetricsLog:
    """Appends one JSON line per evaluation to metrics.jsonl (flushed and fsynced).

    ``records`` starts with the valid lines already in the file, so a resumed
    run's summary covers the whole run.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: list[dict] = read_metrics(self.path).records
        self._file = open(self.path, "a")

    def write(self, record: dict) -> None:
        self.records.append(record)
        self._file.write(line(record))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
