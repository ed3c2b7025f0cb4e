"""Where a command writes (a run folder, a report, a reproduced table) and whether it can.

Checks only: nothing here leaves a file behind (the write test is a temporary
file removed at once). Each check fails with a one-line `UserError` before
any work is done, so a folder that cannot hold the output costs no training
time.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fedjax_pfl.core.errors import UserError


def default_run_folder(method: str, dataset: str, kind: str = "") -> Path:
    """``runs/<method>-<dataset>[-<kind>]-<time>``: where a run goes without ``--out``."""
    return Path(f"runs/{method}-{dataset}{'-' + kind if kind else ''}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_writable(out: Path, flag: str = "--out") -> None:
    """``out`` is a folder, or can be made one, that this process may write in."""
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


def check_run_folder(out: Path, resume: bool) -> None:
    """Fail before any work when ``out`` cannot hold a new run (or, with ``resume``, continue one)."""
    check_writable(out)
    if not resume and ((out / "metrics.jsonl").exists() or (out / "config.json").exists()):
        raise UserError(f"{out} already holds a run; choose another --out, remove it, or continue it with --resume")
