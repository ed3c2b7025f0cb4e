"""metrics.jsonl: one JSON record per evaluation, appended and fsynced line by line; the one reader.

`read_metrics` returns every valid record and the numbers of the lines that
are not one (a write cut short by a kill leaves a torn last line; anything
else is damage), so that no caller silently stops at the first bad line:
the report warns and reads on, a resumed run decides whether it can go on
without losing a record (runs/resume.py). `MetricsLog` appends while a run
trains; `rewrite` replaces the file atomically (when resuming). A record may hold the
method's ``diagnostics`` of its round (a dict of numbers: `Method.round_diagnostics`);
`flat_record` spreads it into columns, `diagnostics` gathers it per name.

A compact record (outputs/compact_record.py) keeps instead `COMPACT`,
metrics.jsonl.xz: the same lines, xz-compressed, with only `COMPACT_KEYS`
(and `COMPACT_IF_PRESENT`), each value as
metrics.jsonl wrote it, so every number reads back exactly;
`read_metrics` reads both, `run_metrics` finds a run folder's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import lzma
import os
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.atomic_file import atomic_write
from fedjax_pfl.outputs.run_output import jsonable

NAME = "metrics.jsonl"
COMPACT = "metrics.jsonl.xz"
# what the tables and the report read from every record (the last one's other numbers are in summary.json)
COMPACT_KEYS = ("round", "accuracy", "accuracy_weighted", "seconds")
# kept where a record has them: whether the method's clients mixed, and the validation accuracy a sweep picks by
COMPACT_IF_PRESENT = ("diagnostics", "client_diagnostics", "val_accuracy")

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


def run_metrics(run_dir: Path) -> Path:
    """The metrics file of the run in ``run_dir``: metrics.jsonl, or a compact record's `COMPACT`."""
    full, compact = Path(run_dir) / NAME, Path(run_dir) / COMPACT
    return compact if compact.is_file() and not full.exists() else full


def _text(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError:
            raise UserError(f"{path} is damaged (not a whole xz stream); restore it, e.g. with git checkout") from None
    return data.decode("utf-8", errors="replace")


def read_metrics(path: Path) -> MetricsFile:
    """Every valid record of ``path`` (metrics.jsonl or `COMPACT`; none when it does not exist) and the
    damaged lines' numbers."""
    path = Path(path)
    records, damaged, line_of = [], [], []
    if path.is_file():
        text = _text(path)
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


PER_CLIENT = "client_diagnostics"  # {name: {client id: number}}: metrics.jsonl only, no column per client


def flat_record(record: dict) -> dict:
    """``record`` with each nested dict (the method's ``diagnostics``: name -> number) spread into
    ``'group/name'`` fields in its place, for metrics.csv's columns and TensorBoard's tags; the per-client
    values (`PER_CLIENT`) are left out.

    Examples:
        >>> flat_record({"round": 3, "diagnostics": {"self_weight": 0.5}, "seconds": 1.0})
        {'round': 3, 'diagnostics/self_weight': 0.5, 'seconds': 1.0}
    """
    flat = {}
    for key, value in record.items():
        if key == PER_CLIENT:
            continue
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


def compact_lines(records: list[dict]) -> str:
    """The lines of `COMPACT` for ``records``: each with `COMPACT_KEYS` (and `COMPACT_IF_PRESENT` where it has
    them) only, values as metrics.jsonl has them."""
    return "".join(line({k: r[k] for k in COMPACT_KEYS + COMPACT_IF_PRESENT if k in r or k in COMPACT_KEYS})
                   for r in records)


def write_compact(path: Path, records: list[dict]) -> None:
    """`COMPACT` of ``records`` at ``path`` (atomically)."""
    with atomic_write(path, "wb") as f:
        f.write(lzma.compress(compact_lines(records).encode()))


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
        """Append ``record``'s line; a write that fails (a full disk) is cut off again, so the file never ends in
        part of a line, and the record is not counted."""
        start = self._file.tell()
        try:
            self._file.write(line(record))
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError:
            self._file = self._reopened_at(start)
            raise
        self.records.append(record)

    def _reopened_at(self, size: int):
        """The file cut back to ``size`` bytes (what a failed write added removed), open for appending again."""
        with contextlib.suppress(OSError):
            self._file.close()  # (its buffer may still hold the failed line: dropped with the handle)
        with contextlib.suppress(OSError):
            os.truncate(self.path, size)
        return open(self.path, "a")

    def close(self) -> None:
        self._file.close()
