"""What comes back from a lease: the records of the runs it made, packed there and landed here.

A device command may return only a few small files, so a lease's run folders
do not come back whole: `pack` first makes every stopped run in the lease's
work folder a compact record (outputs/compact_record.py: config.json,
summary.json, metrics.jsonl.xz, the form reproductions/ commits), then writes
one archive of each run's record files (`record_files`; a run the lease cut
keeps its whole metrics.jsonl; no checkpoint, partition, clients.csv or
figures). The work folder holds only the plan's cells, which were not
finished here. `land` puts those records into the table's runs/ here: a
finished (or failed) run lands in its cell's folder unless a finished run is
there already; a run the lease's end cut is reported and left out (its
checkpoint stayed on the machine: the next lease runs that cell again).
"""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs import metrics_file, run_folder
from fedjax_pfl.outputs.compact_record import compact_runs

KEPT = ("config.json", "summary.json", metrics_file.COMPACT, metrics_file.NAME)
_MEMBER = re.compile(r"^runs/[A-Za-z0-9_.]+-[A-Za-z0-9_.]+/seed[0-9]+/(" + "|".join(map(re.escape, KEPT)) + ")$")
LANDED_STATES = ("finished", "failed")


def record_files(folder: Path) -> dict[str, bytes]:
    """A run folder's record: {file name: its bytes} of the `KEPT` files it has."""
    return {name: (Path(folder) / name).read_bytes() for name in KEPT if (Path(folder) / name).is_file()}


def _status(folder: Path) -> str:
    return (run_folder.read_summary(folder) or {}).get("status") or "running"


def run_folders(runs_dir: Path) -> list[Path]:
    """The cell run folders under a table's runs/ (``<method>-<setting>/seed<k>``)."""
    return sorted(p for p in Path(runs_dir).glob("*/seed*") if run_folder.is_run(p)) if Path(runs_dir).is_dir() else []


def pack(runs_dir: Path, archive: Path) -> list[str]:
    """Make the stopped runs under ``runs_dir`` compact records, then write ``archive`` (tar.gz) with the record
    files of every run there; returns their names (``<group>/seed<k>``)."""
    compact_runs(runs_dir)
    packed = []
    Path(archive).parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for folder in run_folders(runs_dir):
            name = f"{folder.parent.name}/{folder.name}"
            for file, data in record_files(folder).items():
                info = tarfile.TarInfo(f"runs/{name}/{file}")
                info.size, info.mtime = len(data), int((folder / file).stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
            packed.append(name)
    return packed


def _extract(archive: Path, into: Path) -> None:
    """Unpack a records archive, refusing any member that is not a run record file."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar.getmembers():
                if member.isdir():
                    continue
                if not member.isfile() or not _MEMBER.match(member.name):
                    raise UserError(f"{archive}: {member.name!r} is not a run record (runs/<cell>/seed<k>/"
                                    f"{{{','.join(KEPT)}}}); pass a records.tar.gz a lease command wrote")
                target = into / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"cannot read {archive}: {e}; pass a records.tar.gz a lease command wrote") from None


def land(archives: list[Path], runs_dir: Path) -> dict[str, list[str]]:
    """Land the finished runs of ``archives`` (records.tar.gz, or folders holding one) in ``runs_dir``;
    {'landed', 'kept' (a finished run already here), 'cut' ('name (status, rounds)')}."""
    done: dict[str, list[str]] = {"landed": [], "kept": [], "cut": []}
    for raw in archives:
        archive = Path(raw) / "records.tar.gz" if Path(raw).is_dir() else Path(raw)
        if not archive.is_file():
            raise UserError(f"no such records archive: {archive}")
        with tempfile.TemporaryDirectory() as tmp:
            _extract(archive, Path(tmp))
            for folder in run_folders(Path(tmp) / "runs"):
                name = f"{folder.parent.name}/{folder.name}"
                status, target = _status(folder), Path(runs_dir) / name
                if status not in LANDED_STATES:
                    records = run_folder.read_records(folder)
                    done["cut"].append(f"{name} ({status} after round {records[-1]['round'] if records else 0})")
                elif _status(target) in LANDED_STATES:
                    done["kept"].append(name)
                else:
                    if target.exists():
                        shutil.rmtree(target)  # an unfinished run of that cell here: the lease finished it
                    target.mkdir(parents=True)
                    for path in sorted(p for p in folder.iterdir() if p.is_file()):  # what was packed
                        shutil.copyfile(path, target / path.name)
                    done["landed"].append(name)
    here = set(done["landed"]) | set(done["kept"])  # a run one archive has cut and a later one finished
    done["cut"] = [c for c in done["cut"] if c.split(" ", 1)[0] not in here]
    return done


def summary_line(done: dict[str, list[str]]) -> str:
    """One line for the command's output."""
    parts = [f"landed {len(done['landed'])} run(s)"]
    parts += [f"{len(done['kept'])} already here ({', '.join(done['kept'])})"] if done["kept"] else []
    parts += [f"{len(done['cut'])} cut by the lease, not landed: {'; '.join(done['cut'])}"] if done["cut"] else []
    return "; ".join(parts)
