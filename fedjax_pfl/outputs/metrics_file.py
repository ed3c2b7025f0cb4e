"""metrics.jsonl: one JSON record per evaluation, appended and fsynced line by line; the one reader.

`read_metrics` returns every valid record and the numbers of the lines that
are not one (a write cut short by a kill leaves a torn last line; anything
else is damage), so that no caller silently stops at the first bad line:
the report warns and reads on, a resumed run decides whether it can go on
without losing a record (runs/resume.py). `MetricsLog` appends while a run
trains; `rewrite` replaces the file atomically (when resuming). A record may hold the
method's ``diagnostics`` of its round (a dict of numbers: `Method.round_diagnostics`);
`flat_record` spreads it into columns, `diagnostics` gathers it per name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.outputs.run_output import jsonable, read_json

# config.json's mark of a run whose records count rounds from 1 (``round`` 1 is the first round). A run
# folder without it was written when ``round`` was the engine's index from 0; its records are read +1.
NUMBERING = {"rounds_counted_from": 1}


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


def counted_from_zero(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` numbered its records from 0 (its config.json lacks `NUMBERING`)."""
    config = read_json(Path(run_dir) / "config.json")
    return isinstance(config, dict) and config.get("rounds_counted_from") != 1


def read_metrics(path: Path) -> MetricsFile:
    """Every valid record of ``path`` (none when it does not exist) and the damaged lines' numbers.

    Rounds are counted from 1, also for a run folder written before (`counted_from_zero`).
    """
    path = Path(path)
    shift = int(counted_from_zero(path.parent))
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
                records.append({**record, "round": record["round"] + shift})
                line_of.append(number)
    return MetricsFile(path, records, damaged, line_of)


def flat_record(record: dict) -> dict:
    """``record`` with each nested dict (the method's ``diagnostics``: name -> number) spread into
    ``'group/name'`` fields in its place, for metrics.csv's columns and TensorBoard's tags.

    Examples:
        >>> flat_record({"round": 3, "diagnostics": {"self_weight": 0.5}, "seconds": 1.0})
        {'round': 3, 'diagnostics/self_weight': 0.5, 'seconds': 1.0}
    """
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update({f"{key}/{name}": v for name, v in value.items()})
        else:
            flat[key] = value
    return flat


def diagnostics(records: list[dict]) -> dict[str, list[float]]:
    """{name: [value per record]} of the method's diagnostics (NaN where a record lacks one).

    Examples:
        >>> diagnostics([{"round": 1}, {"round": 2, "diagnostics": {"self_weight": 0.5}}])
        {'self_weight': [nan, 0.5]}
    """
    names = list(dict.fromkeys(k for r in records for k in r.get("diagnostics", {})))
    return {name: [r.get("diagnostics", {}).get(name, float("nan")) for r in records] for name in names}


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
