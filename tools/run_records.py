"""What comes back from a lent device: the records of the runs it made, packed there and landed here.

    python tools/run_records.py pack WORK ARCHIVE          # on the lent machine: WORK/runs -> ARCHIVE
    python tools/run_records.py land TABLE ARCHIVE... [--out OUT]   # here: into OUT/runs (reproductions/TABLE)

A device command may return only a few small files, so the run folders of
a device visit do not come back whole: `pack` first makes every stopped run
in the work folder a compact record (fedjax_pfl/outputs/compact_record.py:
config.json, summary.json, metrics.jsonl.xz, the form reproductions/
commits), then writes one archive of each run's record files
(`record_files`; a cut run keeps its whole metrics.jsonl; no checkpoint,
partition, clients.csv or figures). The work folder holds only the planned
cells, which were not finished here. `land` puts those records into the
table's runs/ here: a finished (or failed) run lands in its cell's folder
unless a finished run is there already; a run the visit's end cut is
reported and left out (its checkpoint stayed on the machine: a later visit
runs that cell again). After landing, the table is written again and, when
OUT holds a run plan (run_plan.json), the plan is made again from it.

A plain script of the lab, beside the library: it imports fedjax_pfl and is
imported by no module of it.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: fedjax_pfl from this checkout

from fedjax_pfl.core.errors import UserError  # noqa: E402
from fedjax_pfl.outputs import metrics_file, run_folder  # noqa: E402
from fedjax_pfl.outputs.compact_record import compact_runs  # noqa: E402 (after the path above)

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
                                    f"{{{','.join(KEPT)}}}); pass a records.tar.gz that `pack` wrote")
                target = into / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"cannot read {archive}: {e}; pass a records.tar.gz that `pack` wrote") from None


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
    parts += [f"{len(done['cut'])} cut before their end, not landed: {'; '.join(done['cut'])}"] if done["cut"] else []
    return "; ".join(parts)


def replan_argv(table: list[str], out: Path) -> list[str]:
    """The reproduce command line that writes OUT's table again after landing (``table``: NAME or --table-file
    FILE): with the saved run plan's budget, device kind and overrides when OUT holds run_plan.json (the plan is
    made again), else ``--table-only``."""
    path = Path(out) / "run_plan.json"
    base = [*table, "--out", str(out)]
    if not path.is_file():
        return [*base, "--table-only"]
    plan = json.loads(path.read_text())
    return [*base, "--plan-for-seconds", f"{plan['plan_for_seconds']:g}", "--device-kind", plan["kind"],
            *(plan.get("overrides") or [])]


def main(argv=None) -> int:
    """The two commands of the module docstring; one line and exit 2 on bad input."""
    from fedjax_pfl.commands.command import Command, OneLineParser
    from fedjax_pfl.cells import reproduce
    from fedjax_pfl.papers.table_spec import find_table, load_table

    parser = OneLineParser(prog="python tools/run_records.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="pack the records of WORK/runs into ARCHIVE (tar.gz)")
    packing.add_argument("work")
    packing.add_argument("archive")
    landing = commands.add_parser("land", help="land ARCHIVEs' finished runs in OUT/runs; write the table again")
    landing.add_argument("table", help="the table's name (python -m fedjax_pfl.reproduce --list) or its YAML file")
    landing.add_argument("archives", nargs="+", help="records.tar.gz files, or folders holding one")
    landing.add_argument("--out", help="the table's folder (default reproductions/TABLE)")

    def body() -> int:
        args = parser.parse_args(argv)
        if args.command == "pack":
            packed = pack(Path(args.work) / "runs", Path(args.archive))
            print(f"packed the records of {len(packed)} run(s) into {args.archive}: {', '.join(packed) or 'none'}")
            return 0
        table = ["--table-file", args.table] if args.table.endswith((".yaml", ".yml")) else [args.table]
        spec = load_table(args.table) if len(table) == 2 else find_table(args.table)  # (a bad name: before landing)
        out = Path(args.out or Path("reproductions") / spec.name)
        print(summary_line(land([Path(p) for p in args.archives], out / "runs")), flush=True)
        return reproduce.main(replan_argv(table, out))

    return Command("interrupted").run(body)


if __name__ == "__main__":
    sys.exit(main())
