"""Where a command writes (a run folder, a report, a reproduced table), whether it can, and what a run folder holds.

Checks only: nothing here leaves a file behind (the write test is a temporary
file removed at once). Each check fails with a one-line `UserError` before
any work is done, so a folder that cannot hold the output costs no training
time. `RUN_ENTRIES` names what the training command writes into a run
folder; anything else there is someone else's (`foreign_entries`), and a run
never writes into such a folder.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.outputs.folder_lock import LOCK_FILE

# What the training command writes into a run folder (TensorBoard's event files besides, `is_run_entry`).
RUN_ENTRIES = ("config.json", "partition.json", "metrics.jsonl", "metrics.jsonl.xz", "metrics.csv", "clients.csv",
               "summary.json", "plots", "checkpoint", "error.log", LOCK_FILE)  # (.xz: a compact record's metrics)
RUN_RECORDS = ("config.json", "metrics.jsonl")  # a folder holding either holds a run


def default_run_folder(method: str, dataset: str, kind: str = "") -> Path:
    """``runs/<method>-<dataset>[-<kind>]-<time>``: where a run goes without ``--out``."""
    return Path(f"runs/{method}-{dataset}{'-' + kind if kind else ''}-{time.strftime('%Y%m%d-%H%M%S')}")


# Characters the paths a run writes inside its folder take beyond it, with room to spare: the longest is a
# checkpoint's temporary folder, e.g. checkpoint/40.orbax-checkpoint-tmp-1733350000000000/state/array_metadatas/...
INSIDE_RUN_FOLDER = 200
NAME_MAX, PATH_MAX = 255, 4096  # POSIX systems' usual limits, where the file system does not say


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError, AttributeError):
        return default


def check_length(out: Path, flag: str = "--out") -> None:
    """UserError when a name in ``out`` is longer than its file system allows, or ``out`` (made absolute) leaves
    too little room for the paths a run writes inside it (`INSIDE_RUN_FOLDER`) under the system's path limit."""
    absolute = Path(os.path.abspath(out))
    existing = next((p for p in (absolute, *absolute.parents) if os.path.isdir(p)), Path("/"))
    name_max = _limit(existing, "PC_NAME_MAX", NAME_MAX)
    long = next((part for part in absolute.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        raise UserError(f"{flag} holds a folder name of {len(os.fsencode(long))} characters ({long[:12]}...), more "
                        f"than the {name_max} this file system allows for one name; choose a shorter {flag}")
    path_max = _limit(existing, "PC_PATH_MAX", PATH_MAX)
    length = len(os.fsencode(str(absolute)))
    if length + INSIDE_RUN_FOLDER > path_max:
        raise UserError(f"{flag} is {length} characters long as an absolute path; the files a run writes inside it "
                        f"need {INSIDE_RUN_FOLDER} more, past the {path_max} this system allows for a path: choose a "
                        f"shorter {flag}")


def check_writable(out: Path, flag: str = "--out") -> None:
    """``out`` is a folder, or can be made one, that this process may write in (`check_length` first)."""
    check_length(out, flag)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out} is a file, not a folder; choose another {flag}")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {out} lies under {existing}, which is a file; choose another {flag}")
    try:  # (os.access says yes to root in /proc, where no file can be made)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError:
        raise UserError(f"cannot write in {existing} (permission denied or read-only); choose another {flag}") from None


def is_run_entry(name: str) -> bool:
    """Whether a file or folder named ``name`` in a run folder is the training command's: one of `RUN_ENTRIES`,
    a TensorBoard event file, or a temporary file of one being written (outputs/atomic_file.py: '.NAME.xxxx')."""
    if name in RUN_ENTRIES or name.startswith("events.out.tfevents."):
        return True
    return name.startswith(".") and any(name.startswith(f".{entry}.") for entry in RUN_ENTRIES)


# What a run folder may hold before its records exist (a run killed while loading, an internal error then).
BEFORE_RECORDS = (LOCK_FILE, "error.log")


def foreign_entries(out: Path) -> list[str]:
    """The names in folder ``out`` that no run wrote (sorted; none when it does not exist). Without a run's
    records (`holds_run`) only `BEFORE_RECORDS` are a run's: a metrics.csv or plots/ there are someone else's."""
    out = Path(out)
    if not out.is_dir():
        return []
    ours = is_run_entry if holds_run(out) else (lambda name: name in BEFORE_RECORDS)
    return sorted(p.name for p in out.iterdir() if not ours(p.name))


def holds_run(out: Path) -> bool:
    """Whether ``out`` holds a run's records (`RUN_RECORDS`), finished or not."""
    return any((Path(out) / name).exists() for name in RUN_RECORDS)


def check_not_foreign(out: Path) -> None:
    """A folder holding anything a run did not write (a user's own files) is never a run's output folder."""
    foreign = foreign_entries(out)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(f"--out {out} holds files that are not a run's ({shown}); a run writes into a new or empty "
                        "folder (or its own): choose another --out")
